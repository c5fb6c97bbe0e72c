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
        """Forget per-request state (called before each request). Not the caches: a runner
        records which tokens its slots hold (models.synced_cache), so the next request keeps
        whatever prefix it shares with them, e.g. the earlier turns of a conversation."""

    def propose(
        self,
        sequences: list[list[int]],
        slots: list[int],
        budgets: list[int],
        policies: list[DraftPolicy],
        samplings: list[SamplingConfig],
        generators: list[torch.Generator | None],
    ) -> list[Proposal]:
        """For each row j (in cache slot slots[j]): draft at most budgets[j] tokens after
        sequences[j] (budget 0: an empty proposal), asking policies[j] before and after each
        token and drawing by samplings[j] with generators[j] (each request has its own decoding
        rule)."""

    # Optional: a drafter that learns online (DVI) also defines
    #   observe(slot, proposal, target_logits, num_accepted)
    # which the engine calls after verifying `proposal` (the verified prefix) of that slot,
    #   summary() -> str | None   a line on what it has learned so far (None: nothing to report)
    #   save(path)                 write what it has learned;
    # a drafter that shares work with the verifier (DVI's shallow cache) defines
    #   verifier(target_runner) -> runner   the runner the engine verifies through;
    # and a drafter (or verify policy) with a model of its own defines
    #   clear_cache()              empty that model's cache (SpeculativeEngine.clear_cache).
