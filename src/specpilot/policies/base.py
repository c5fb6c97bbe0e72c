"""Plug points for adaptive methods: how far to draft, and how much of a draft to verify.

A `DraftPolicy` sees each draft distribution before its token is drawn and may stop there (the
decision depends only on the prefix), and sees each drafted token and may stop after it; it never
removes a token it has already let through (that would change the proposal distribution and
break losslessness, docs/methods.md §1.2). A `VerifyPolicy` may truncate a finished chain to a
prefix before verification, which is safe. Both observe each step's outcome. A `BatchPlanner`
(optional) sets every row's budget for the step from the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specpilot.config import SamplingConfig
from specpilot.types import Proposal, StepRecord


@dataclass(frozen=True)
class DraftToken:
    """A token just drafted, with the draft logits it was chosen from (None if model-free)."""

    index: int
    token: int
    logits: torch.Tensor | None  # [vocab]


class DraftPolicy(Protocol):
    def reset(self) -> None:
        """Called at the start of each request."""

    def draft_budget(self) -> int:
        """Most tokens to draft in the coming step."""

    def admits(self, logits: torch.Tensor) -> bool:
        """Whether to draft a token from these draft logits ([vocab]) at all. Decided before
        the token is drawn, so stopping here depends on the prefix alone (lossless)."""

    def continue_drafting(self, drafted: DraftToken) -> bool:
        """Whether to draft another token after `drafted` (the budget still caps it)."""

    def observe(self, record: StepRecord) -> None:
        """Learn from the verified step."""


@runtime_checkable
class TreePolicy(Protocol):
    """A draft policy that also shapes dynamic trees (LTD): tree drafters consult it after each
    level and once the tree is grown. Both decisions read only the draft's scores."""

    def continue_tree(self, tree, context_len: int) -> bool:
        """Grow another level of `tree` (a drafting.dynamic_tree.DynamicTree)?"""

    def tree_size(self, tree, context_len: int) -> int | None:
        """How many candidates the target verifies (None: the drafter's own count)."""


class VerifyPolicy(Protocol):
    def reset(self) -> None: ...

    def select(
        self,
        sequences: list[list[int]],
        proposals: list[Proposal],
        slots: list[int],
        samplings: list[SamplingConfig],
    ) -> list[int]:
        """For each row of the batch (committed sequence, its proposal, its cache slot): how
        many leading drafted tokens the target verifies (0..k). Seeing the whole batch lets a
        policy trade verification tokens between requests (SV); `samplings[j]` is row j's
        decoding rule (the distributions its tokens are drawn from)."""

    def observe(self, record: StepRecord) -> None: ...


class BatchPlanner(Protocol):
    """Optional, batch-level: decides each step's final draft budgets for all running rows at
    once, before drafting (the goodput controller). A budget depends only on the past, so any
    plan is lossless (docs/methods.md §1.2)."""

    reads_target_confidence: bool
    """Whether the next step's records are to carry the target's confidence
    (`StepRecord.target_confidence`, a pass over the vocabulary per row)."""

    def plan(
        self, policies: list[DraftPolicy], caps: list[int], remaining: list[int] | None = None
    ) -> list[int]:
        """Per row a budget in 0..caps[q] (caps: each row's policy budget within its room).
        `remaining`: each row's tokens still to emit when the caller waits for the last row to
        finish (a fixed batch); None when finished rows make room for others (a server)."""

    def observe(
        self,
        budgets: list[int],
        records: list[StepRecord],
        draft_s: float,
        verify_s: float,
        step_s: float,
    ) -> None:
        """The finished step: the budgets, the rows' records, seconds drafting (and selecting),
        verifying, and in all."""

    def retire(self, policy: DraftPolicy) -> None:
        """A row's request has ended (`policy`: its own copy, as it ended)."""


@runtime_checkable
class TimedPolicy(Protocol):
    """A draft policy that runs models of its own (LTD's networks): the engine records their
    time in each step's `StepRecord.policy_s`."""

    def take_seconds(self) -> float:
        """Seconds spent deciding since the last call."""


@runtime_checkable
class DrafterShapingPolicy(Protocol):
    """A policy that sets its drafter's shape (LTD and tree-goodput: a tree's depth, width)."""

    def drafter_options(self, drafter: str, given: dict) -> dict:
        """The options to build `drafter` (a drafter name) with, from those `given`."""


@runtime_checkable
class CacheHolder(Protocol):
    """A plug (drafter or verify policy) with a model of its own whose cache the engine empties
    with the target's (SpeculativeEngine.clear_cache)."""

    def clear_cache(self) -> None:
        """Empty that model's cache, so the next request starts cold."""
