"""SVIP: stop drafting when the draft's own entropy says a rejection is coming (SVIP paper §2.2).

The acceptance probability of a drafted token is β = 1 − TV(p, q) ≳ 1 − sqrt(c·H(q)) (Pinsker
plus the paper's cross-entropy approximation), so a draft that is unsure of its token is likely
to be rejected, and drafting past it wastes draft steps. Rule as in the authors' code
(docs/methods.md §5): H is the entropy in nats of the draft's raw logits at temperature 1; after
appending a token, stop if sqrt(c·H) > h, i.e. H > h²/c (0.6 nats for the defaults). The
high-entropy token itself is kept (keep-then-stop); at least one and at most `max_k` tokens.

`keep_uncertain=False` applies the same rule before the token instead: drafting stops at a
distribution whose entropy is over the limit without drawing from it, so a step may draft
nothing and be one plain decoding step. The decision still depends on the prefix alone, so it
stays lossless. It suits drafters whose first token is often hopeless and whose cost is mostly
paid before the entropy is known (DVI's shallow layers: a step that drafts nothing skips the
extra shallow step and the wider verification). The DVI authors' code has the same kind of stop
(`--spec-adaptive`, max p < 0.6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specpilot.config import require
from specpilot.policies.base import DraftToken
from specpilot.sampling import entropy
from specpilot.types import StepRecord


@dataclass
class SvipPolicy:
    c: float = 0.15
    h: float = 0.3
    max_k: int = 40
    keep_uncertain: bool = True

    def __post_init__(self) -> None:
        require(self.c > 0, f"svip c must be > 0, got {self.c}")
        require(self.h >= 0, f"svip h must be >= 0, got {self.h}")
        require(1 <= self.max_k <= 64, f"svip max_k must be in 1..64, got {self.max_k}")

    @property
    def entropy_limit(self) -> float:
        """Entropy (nats) above which drafting stops: sqrt(c·H) > h ⇔ H > h²/c."""
        return self.h * self.h / self.c

    def reset(self) -> None:
        pass

    def draft_budget(self) -> int:
        return self.max_k

    def certain(self, logits: torch.Tensor | None) -> bool:
        """sqrt(c·H) <= h; model-free drafters (n-gram) carry no distribution and always pass."""
        return logits is None or math.sqrt(self.c * float(entropy(logits))) <= self.h

    def admits(self, logits: torch.Tensor) -> bool:
        return self.keep_uncertain or self.certain(logits)

    def continue_drafting(self, drafted: DraftToken) -> bool:
        return not self.keep_uncertain or self.certain(drafted.logits)

    def observe(self, record: StepRecord) -> None:
        pass
