"""The interface the engine needs from a model: append tokens to a KV cache, score them, roll back.

A runner owns the KV cache of one sequence per slot (`batch_size` slots; `forward` uses slot 0).
`forward` appends n tokens after the cached ones and returns logits for the rows asked for;
`rollback(length)` forgets everything past `length` (static caches just lower the length; garbage
past it is never read). `cached` records which tokens each slot holds, so later sequences reuse
the longest common prefix (models.synced_cache). The engine keeps the invariant: after a step,
the target cache holds exactly len(sequence) − 1 positions (the last committed token is fed at
the next step), and its record lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from specpilot.models.synced_cache import CachedTokens

LogitRows = Literal["all", "last", "none"]


@dataclass
class RunnerOutput:
    logits: torch.Tensor | None
    """[rows, vocab] float32 logits for the rows asked for, or None."""
    hidden: torch.Tensor | None
    """[n, hidden] output of the last layer run (before the final norm); None on the ggml
    backend, whose graph keeps only the scored rows past the last layer."""
    taps: dict[int, torch.Tensor] = field(default_factory=dict)
    """Layer index k → [n, hidden] hidden state after the first k decoder layers."""


class CausalRunner(Protocol):
    """What every model backend offers the engine."""

    backend: str
    """Which backend computes (models.loading.BACKENDS: "ggml", "torch", "hf"): policies keep
    what they measure of a runner's speed per backend."""
    vocab_size: int
    max_length: int
    batch_size: int
    dtype: torch.dtype
    device: torch.device
    cached: CachedTokens
    """Which tokens each slot holds; trimmed by `rollback`, cleared by `reset`."""

    @property
    def length(self) -> int:
        """Number of positions held in the cache."""

    def forward(self, input_ids: list[int], logits: LogitRows = "all") -> torch.Tensor | None:
        """Append input_ids to the cache; return [rows, vocab] float32 logits."""

    def forward_batch(
        self, rows: list[list[int]], slots: list[int], logits: LogitRows = "all", head=None
    ) -> list[torch.Tensor | None]:
        """Append rows[j] to slot slots[j] in one pass; per-row logits like `forward`."""

    def rollback(self, length: int, slot: int = 0) -> None:
        """Forget cached positions >= length (of one slot)."""

    def reset(self) -> None:
        """Empty the cache (every slot)."""
