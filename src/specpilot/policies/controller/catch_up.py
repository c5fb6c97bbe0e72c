"""Catch-up pricing (docs/methods.md §7.4): a row that did not draft on its last step first
catches its drafter up, once. A draft model reads the whole prompt when the request first
drafts (a start), or the few tokens accepted meanwhile when it resumes. Both costs are learned
from the steps that pay them and charged to plans that have a row catch up: when maximising
tokens per second, spread over the steps they serve (a resume serves one spell, `horizon`; a
start every step its request drafts on, `start_horizon`), so a large batch does not pay every
row's prompt read for one step of drafting; whole when finishing a batch, and a start more
when it is expected to serve fewer steps than the plan takes (`finishing_catch_up`)."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence

from specpilot.policies.controller.row_policy import GoodputPolicy

RESUME_HORIZON = 16
"""The most steps a row that resumes drafting is expected to go on drafting, and the guess
before any drafting spell has ended."""


def finishing_catch_up(
    catch_up: Sequence[float], serves: Sequence[float] | None, budgets: Sequence[int], steps: float
) -> float:
    """Catch-up seconds a plan that finishes its batch in `steps` steps is charged: each drafting
    row's whole, or more for one expected to serve fewer steps than that (`serves`, None: none
    is): its whole times steps / serves. A plan's saving accrues over all its steps, but a start
    is repaid only over the steps its request goes on drafting, and near break-even drafting
    stops within a few."""
    total = 0.0
    for q, budget in enumerate(budgets):
        if budget and catch_up[q]:
            total += catch_up[q] * (max(steps / serves[q], 1.0) if serves is not None else 1.0)
    return total


class CatchUp:
    """The catch-up costs and how long drafting lasts, over the last `window` samples each."""

    def __init__(self, window: int) -> None:
        self.start: deque[float] = deque(maxlen=window)
        """Seconds of catch-up per row drafting for the first time in its request."""
        self.resume: deque[float] = deque(maxlen=window)
        """Seconds of catch-up per row resuming after steps without drafting."""
        self.spells: deque[int] = deque(maxlen=window)
        """Lengths in steps of the last drafting spells rows ended (`horizon`)."""
        self.lifetimes: deque[int] = deque(maxlen=window)
        """Steps drafted on, in all, by the last requests that drafted (`start_horizon`)."""
        self.starting = self.resuming = 0
        """Rows that start or resume drafting in the step planned last (its draft time is not
        T_draft alone)."""

    def horizon(self) -> float:
        """Steps a row that resumes drafting is expected to draft for, paying its catch-up over
        them: the median of the spells rows ended lately, within 1..RESUME_HORIZON (that before
        any); also a start's until a request that drafted has ended (`start_horizon`). Rows that
        start together near break-even often stop after a step or two: a longer guess would
        charge them too little."""
        if not self.spells:
            return float(RESUME_HORIZON)
        return min(max(statistics.median(self.spells), 1.0), float(RESUME_HORIZON))

    def start_horizon(self) -> float:
        """Steps a request that starts drafting is expected to draft on, over all its spells
        (at least 1; before any request that drafted has ended, `horizon`). A start reads the
        prompt once and serves every later spell: priced over one spell, it would be charged
        for each."""
        if not self.lifetimes:
            return self.horizon()
        return max(statistics.median(self.lifetimes), 1.0)

    def expected(self, policy: GoodputPolicy) -> float:
        """Seconds this row's drafter is expected to spend catching up if it drafts now (0 when
        it drafted on the last step; unknown costs count as 0, so they get measured)."""
        if policy.drafted_last:
            return 0.0
        samples = self.resume if policy.drafted_ever else self.start or self.resume
        return statistics.median(samples) if samples else 0.0

    def charge(self, policy: GoodputPolicy, whole: bool) -> float:
        """Seconds a plan that has this row draft now is charged for catching its drafter up:
        whole when finishing a batch, else per step of what it serves (a start over
        `start_horizon`, a resume over `horizon`)."""
        seconds = self.expected(policy)
        if whole or not seconds:
            return seconds
        return seconds / (self.horizon() if policy.drafted_ever else self.start_horizon())

    def serves(self, policies: Sequence[GoodputPolicy]) -> list[float] | None:
        """When plans finish a batch: the steps each row's catch-up is expected to serve, a
        start's `start_horizon`, a resume's unbounded (charged whole, it is a few tokens' read);
        None before any request a plan started has ended (every catch-up whole)."""
        if not self.lifetimes:
            return None
        start = self.start_horizon()
        return [math.inf if policy.drafted_ever else start for policy in policies]

    def note_plan(self, policies: Sequence[GoodputPolicy], budgets: Sequence[int]) -> None:
        """Count the rows that start or resume drafting now: their step's drafting time holds
        their catch-up (`learn`). Note the spells the plan ends."""
        cold = [
            policy for policy, budget in zip(policies, budgets, strict=True)
            if budget > 0 and not policy.drafted_last
        ]  # fmt: skip
        self.starting = sum(not policy.drafted_ever for policy in cold)
        self.resuming = len(cold) - self.starting
        for policy, budget in zip(policies, budgets, strict=True):
            if policy.spell and not budget:  # it stops drafting now
                self.spells.append(policy.spell)

    @property
    def catching_up(self) -> bool:
        """Whether rows start or resume drafting in the step planned last."""
        return bool(self.starting or self.resuming)

    def learn(self, extra: float) -> None:
        """The seconds the step planned last spent drafting beyond T_draft: its rows' catch-up.
        In a mix, the resumes are taken at their usual cost and the starts pay the rest."""
        if not self.starting:
            self.resume.append(extra / self.resuming)
        elif not self.resuming or self.resume:
            resumed = self.resuming * statistics.median(self.resume) if self.resuming else 0.0
            self.start.append(max(extra - resumed, 0.0) / self.starting)

    def retire(self, policy: GoodputPolicy) -> None:
        """A row's request has ended: its spell ends with it, and the steps it drafted on in all
        are what a start served, if a plan started it (one that only probed was a test)."""
        if policy.spell:
            self.spells.append(policy.spell)
        if policy.planned:
            self.lifetimes.append(policy.drafted_steps)
