"""The ggml backend: the runner protocol on llama.cpp (through llama-cpp-python's ctypes binding),
reading GGUF files as stored. Modules: `library` (the binding), `config`, `batch` (llama_batch),
`trees` (exact tree verification by sequence ids), `taps` (hidden states after chosen layers),
`runner`, `files` (GGUF files, tokenizer), `embedding` (a GGUF's token-embedding rows)."""

from specpilot.models.ggml.config import GgmlConfig
from specpilot.models.ggml.library import available
from specpilot.models.ggml.runner import GgmlRunner

__all__ = ["GgmlConfig", "GgmlRunner", "available"]
