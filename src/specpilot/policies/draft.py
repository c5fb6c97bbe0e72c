"""Training-free draft-length policies: a constant k, and Hugging Face's +2/−1 heuristic."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specpilot.config import require
from specpilot.policies.base import DraftToken
from specpilot.types import StepRecord


@dataclass
class ConstantPolicy:
    """Draft exactly k tokens every step (default 3: the best constant for the default pair on a
    2-core CPU, BENCHMARKS.md)."""

    k: int = 3

    def __post_init__(self) -> None:
        require(1 <= self.k <= 64, f"k must be in 1..64, got {self.k}")

    def reset(self) -> None:
        pass

    def draft_budget(self) -> int:
        return self.k

    def admits(self, logits: torch.Tensor) -> bool:
        return True

    def continue_drafting(self, drafted: DraftToken) -> bool:
        return True

    def observe(self, record: StepRecord) -> None:
        pass


@dataclass
class HeuristicPolicy:
    """Hugging Face assisted generation's schedule: start at 5, +2 after a fully accepted draft,
    −1 otherwise, within [min_k, max_k]. Reset per request (HF's `heuristic_transient`), so one
    request's luck does not leak into the next."""

    initial_k: int = 5
    increase: int = 2
    decrease: int = 1
    min_k: int = 1
    max_k: int = 40
    k: int = field(init=False)

    def __post_init__(self) -> None:
        require(
            1 <= self.min_k <= self.initial_k <= self.max_k,
            "need 1 <= min_k <= initial_k <= max_k, "
            f"got {self.min_k}, {self.initial_k}, {self.max_k}",
        )
        require(self.increase >= 0 and self.decrease >= 0, "increase and decrease must be >= 0")
        self.k = self.initial_k

    def reset(self) -> None:
        self.k = self.initial_k

    def draft_budget(self) -> int:
        return self.k

    def admits(self, logits: torch.Tensor) -> bool:
        return True

    def continue_drafting(self, drafted: DraftToken) -> bool:
        return True

    def observe(self, record: StepRecord) -> None:
        if record.num_drafted == 0:
            return
        if record.num_accepted == record.num_drafted:
            self.k = min(self.max_k, self.k + self.increase)
        else:
            self.k = max(self.min_k, self.k - self.decrease)
