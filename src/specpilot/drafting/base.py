"""The drafter interface: propose a chain (or tree) of tokens continuing each committed sequence.

Drafters are stateless towards the engine: each `propose` receives the whole committed sequence
of every row, and a drafter with a cache re-synchronises it itself (keeping the longest common
prefix of what that row's cache slot holds and the sequence). The engine therefore never tells a
drafter what was accepted. There is one entry point, for a batch: a lone row is a batch of one
in its own cache slot, so a drafter's per-slot state always follows the request in that slot.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from specpilot.config import SamplingConfig
from specpilot.policies.base import DraftPolicy
from specpilot.types import Proposal


class Drafter(Protocol):
    default_budget: int | None
    """The drafter's natural draft length (a tree's depth), which a constant policy takes as its
    k when none is given; None: no such length."""

    drafts_jointly: bool
    """Whether one draft forward per drafted position serves every drafting row, so a step's
    drafting costs as much as its deepest budget (the goodput controller's cost model)."""

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


@runtime_checkable
class FeatureDrafter(Drafter, Protocol):
    """A drafter that reads the target's hidden states (EAGLE): the engine's target pass taps
    `feature_layers` in the forwards it runs anyway and hands over the committed positions'
    taps (engine.target_pass)."""

    feature_layers: tuple[int, ...]
    """The target layers whose outputs the drafter reads, concatenated in this order."""

    def reusable(self, slot: int, sequence: list[int]) -> int:
        """Leading positions of `sequence` this slot holds features for: the target's cache is
        kept no further (its forwards would have given the rest)."""

    def take_features(self, slot: int, start: int, taps: torch.Tensor, tokens: list[int]) -> None:
        """The target committed `tokens` at positions start..start + n − 1 of `slot` with these
        taps ([n, layers · hidden])."""


@runtime_checkable
class LearningDrafter(Drafter, Protocol):
    """A drafter that learns online from verified steps (DVI)."""

    def observe(
        self, slot: int, proposal: Proposal, target_logits: torch.Tensor, num_accepted: int
    ) -> None:
        """After verifying `proposal` (the verified chain) of `slot`: the target's logits for
        it ([k + 1, vocab]) and how many of its tokens were accepted."""

    def summary(self) -> str | None:
        """A line on what it has learned so far (None: nothing to report)."""

    def save(self, path: str) -> None:
        """Write what it has learned."""


@runtime_checkable
class SharedTargetDrafter(Drafter, Protocol):
    """A drafter that shares work with the verifier (DVI's shallow cache): the engine verifies
    through the runner it returns."""

    def verifier(self, target):
        """The runner to verify through, given the target's runner (a models.runner
        CausalRunner) this drafter was built on."""
