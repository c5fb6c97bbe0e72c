"""What a step costs: T_verify, T_draft, T_other and the tokens a budget feeds the target, all
learned from the steps' own timings and outcomes (docs/methods.md §7.2)."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Sequence

from specpilot.policies.controller.draft_cost import DraftCost
from specpilot.policies.controller.exploration import MAX_PROBE_GAP, RETIME_SAMPLES
from specpilot.policies.latency import LatencyCurve
from specpilot.types import StepRecord

SAMPLE_AGE = (RETIME_SAMPLES + 1) * MAX_PROBE_GAP
"""Steps after which a verification timing is forgotten (drafting steps, for a draft timing):
a size timed once under load would otherwise rule out the plans that feed it, and never be
re-timed. Long enough that a verdict's re-timing probes, MAX_PROBE_GAP apart, keep their
RETIME_SAMPLES timings."""


class StepCosts:
    """The seconds of a step of given budgets: other + T_draft(budgets) + T_verify(fed), with
    `joint` as DraftCost takes it and `verify_prior` (tokens, seconds) points of a profiled
    T_verify; each learned over the last `window` samples per size."""

    def __init__(self, joint: bool, verify_prior: Iterable[tuple[float, float]], window: int):
        self.joint = joint
        self.verify = LatencyCurve(verify_prior, window, max_age=SAMPLE_AGE)
        self.draft = DraftCost(joint, window, SAMPLE_AGE)
        self.other: deque[float] = deque(maxlen=window)
        self.fed_per_depth = 1.0
        """Verified tokens per unit of budget, over all budgets (the guess for a new budget)."""
        self.nodes_by_budget: dict[int, float] = {}
        """Verified tokens of a row given each budget: the budget for chains, the tree size for
        trees, less when lookups come up short or SV trims."""

    def other_seconds(self) -> float:
        """T_other: the median of a step's seconds outside drafting and the target forward."""
        return statistics.median(self.other) if self.other else 0.0

    def nodes(self, budget: int) -> float:
        """Tokens a row with this budget is expected to have verified (a chain: the budget)."""
        if budget <= 0:
            return 0.0
        return self.nodes_by_budget.get(budget, budget * self.fed_per_depth)

    def fed(self, budgets: Sequence[int]) -> float:
        """Tokens a step of these budgets feeds the target: each row's own and its drafts."""
        return len(budgets) + sum(self.nodes(k) for k in budgets)

    def fed_limit(self) -> float:
        """The most tokens a plan may feed: beyond the largest size timed T_verify is a guess,
        so plans go at most twice as far, and the next step measures further."""
        return 2 * self.verify.points()[-1][0]

    def step_seconds(self, budgets: Sequence[int]) -> float:
        return self.other_seconds() + self.draft(budgets) + self.verify(self.fed(budgets))

    def timed_draft(self, budgets: Sequence[int]) -> float:
        """T_draft(budgets), 0 before any drafting step is timed."""
        return self.draft(budgets) if self.draft.timed else 0.0

    def marginal_seconds(self, budgets: Sequence[int]) -> float:
        """What one more drafted position adds to a step planned with these budgets: its share
        of verification (a tree adds its nodes per depth) and, for drafters whose rows draft
        one after another, one more draft unit."""
        fed = self.fed(budgets)
        seconds = (self.verify(fed) - self.verify(max(fed - 1, 1))) * self.fed_per_depth
        if not self.joint:
            units = sum(budgets)
            seconds += self.draft.curve(units) - self.draft.curve(units - 1)
        return seconds

    def learn(
        self,
        budgets: Sequence[int],
        records: Sequence[StepRecord],
        draft_s: float | None,
        verify_s: float,
        other_s: float,
    ) -> None:
        """One step's timings and verified tokens; `draft_s` None where the step's drafting
        time holds rows' catch-up as well (CatchUp.learn), which is no T_draft sample."""
        self.verify.add(sum(1 + record.num_nodes for record in records), verify_s)
        if draft_s is not None:
            self.draft.add(budgets, draft_s)
        self.other.append(other_s)
        planned = sum(budgets)
        if planned:
            ratio = sum(record.num_nodes for record in records) / planned
            self.fed_per_depth = 0.9 * self.fed_per_depth + 0.1 * ratio
        for budget, record in zip(budgets, records, strict=True):
            if budget > 0:
                known = self.nodes_by_budget.get(budget, record.num_nodes)
                self.nodes_by_budget[budget] = 0.9 * known + 0.1 * record.num_nodes
