"""How a ggml runner sets up its llama.cpp context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from specpilot.config import require

KV_TYPES = {"f16": 1, "f32": 0}
"""ggml type ids of the KV cache's element types."""


@dataclass(frozen=True)
class GgmlConfig:
    """`n_threads`: None uses every CPU this process may run on. `flash_attn`: None lets
    llama.cpp decide (on for the CPU), which computes attention through f16: logits then differ
    from float32 attention by ~1e-4, so exactness tests turn it off. `kv_type`: the KV cache's
    element type (llama.cpp's default f16; f32 for exactness tests against float32 torch).
    `n_ubatch`: the most tokens llama.cpp computes in one graph (longer prefills are split).
    `repack`: let llama.cpp repack Q4_K weights for its own matmul kernels (`use_extra_bufts`),
    the fastest for one to three tokens. False keeps them as stored, so that where the library
    has specpilot's multi-row kernels (models.ggml.library.multirow_kernels) every quantized
    matmul goes through them: a forward over n tokens then gives bit for bit the logits of n
    one-token forwards (exact verification), and one-token steps are slower (3 % in llama-bench
    on the EPYC)."""

    n_threads: int | None = None
    flash_attn: bool | None = None
    kv_type: Literal["f16", "f32"] = "f16"
    n_ubatch: int = 512
    repack: bool = True

    def __post_init__(self):
        require(self.n_threads is None or self.n_threads >= 1, "n_threads must be >= 1")
        require(self.kv_type in KV_TYPES, f"kv_type must be one of {', '.join(KV_TYPES)}")
        require(self.n_ubatch >= 1, "n_ubatch must be >= 1")
