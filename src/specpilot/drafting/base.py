"""The drafter interface: propose a chain (or tree) of tokens continuing each committed sequence.

Drafters are stateless towards the engine: each `propose` receives the whole committed sequence
of every row, and a drafter with a cache re-synchronises it itself (keeping the longest common
prefix of what that row's cache slot holds and the sequence). The engine therefore never tells a
drafter what was accepted. There is one entry point, for a batch: a lone row is a batch of one
in its own cache slot, so a drafter's per-slot state always follows the request in that slot.
"""

from __future__ import annotations

from typing import Protocol

import torch

from specpilot.config import SamplingConfig
from specpilot.policies.base import DraftPolicy
from specpilot.types import Proposal


class Drafter(Protocol):
    def reset(self) -> None:
        """Forget any per-request state (called before each request)."""

    def propose(
        self,
        sequences: list[list[int]],
        slots: list[int],
        budgets: list[int],
        policies: list[DraftPolicy],
        sampling: SamplingConfig,
        generators: list[torch.Generator | None],
    ) -> list[Proposal]:
        """For each row j (in cache slot slots[j]): draft at most budgets[j] tokens after
        sequences[j] (budget 0: an empty proposal), asking policies[j] before and after each
        token and drawing with generators[j]."""

    # Optional: a drafter that learns online (DVI) also defines
    #   observe(slot, proposal, target_logits, num_accepted)
    # which the engine calls after verifying `proposal` (the verified prefix) of that slot,
    #   summary() -> str | None   a line on what it has learned so far (None: nothing to report)
    #   save(path)                 write what it has learned,
    # and a drafter that shares work with the verifier (DVI's shallow cache) defines
    #   verifier(target_runner) -> runner   the runner the engine verifies through.


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix (C-speed when one is a prefix of the other)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
