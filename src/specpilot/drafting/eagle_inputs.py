"""What the eagle head reads of its target besides the taps of the target's forwards: the token
embedding (joined to each feature) and the rotary tables (the head's own attention positions).

A lean-decoder target holds both as torch tensors. A ggml target keeps its weights inside
llama.cpp, so the embedding rows come from its GGUF file (models.ggml.embedding, dequantized on
demand) and the rotary tables from its config, computed as the torch decoder computes them: the
head sees the same inputs on either backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specpilot.errors import ConfigError
from specpilot.models.decoder_weights import rotary_tables


@dataclass(frozen=True)
class HeadInputs:
    embed: Callable[[list[int]], torch.Tensor]
    """Token ids → [n, hidden] embedding rows in `dtype`."""
    cos: torch.Tensor
    """[max_length, head_dim] in `dtype`, as `sin`."""
    sin: torch.Tensor
    dtype: torch.dtype
    """What the head computes in."""
    device: torch.device

    @classmethod
    def of_decoder(cls, runner) -> HeadInputs:
        """A lean-decoder target's own embedding and tables, in its dtype."""
        if not hasattr(runner, "embed"):
            raise ConfigError(
                "the eagle drafter reads the target's token embedding: serve the target with the "
                "lean decoder (Llama/Qwen2 family) or the ggml backend"
            )

        def embed(ids: list[int]) -> torch.Tensor:
            return F.embedding(torch.tensor(ids, device=runner.device), runner.embed)

        return cls(embed, runner.cos, runner.sin, runner.dtype, runner.device)

    @classmethod
    def of_gguf(cls, runner, config) -> HeadInputs:
        """A ggml target's (`runner`, a GgmlRunner) embedding rows from its GGUF and tables
        from its transformers `config` (Llama, Qwen2 and Mistral share one rotary
        module), in the runner's `torch_dtype`."""
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        from specpilot.models.ggml.embedding import GgufEmbedding

        dtype, device = runner.torch_dtype, torch.device("cpu")
        rows = GgufEmbedding(runner.path, runner.hidden_size).rows
        cos, sin = rotary_tables(LlamaRotaryEmbedding(config), runner.max_length, device, dtype)
        return cls(lambda ids: rows(ids).to(dtype), cos, sin, dtype, device)
