"""Exploration (docs/methods.md §7.4): what the controller tries so that its estimates do not go
stale where idle steps teach nothing. Probes: while no row drafts, now and then one row drafts
one token, spaced so that probing costs about `probe_share` of throughput (`gap`). Deepening: a
position no plan reaches is tried until it is known (`deepen`)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from specpilot.config import require
from specpilot.policies.controller.plan_search import optimal, plan_value
from specpilot.policies.controller.row_policy import GoodputPolicy

if TYPE_CHECKING:
    from specpilot.policies.controller.acceptance import AcceptanceByPosition
    from specpilot.policies.controller.catch_up import CatchUp
    from specpilot.policies.controller.step_costs import StepCosts

EXPLORE_SAMPLES = 8
"""Verified first positions the batch-wide acceptance needs before the controller trusts it to
stop drafting (until then every step without drafting is a probe), and tests of a position
before a plan stops deepening to it."""

MAX_PROBE_GAP = 512
"""The most steps without drafting between two probes."""

RETIME_SAMPLES = 2
"""Timings of a probe's verification size the controller needs before it trusts a verdict that
drafting cannot pay even if always accepted (a first timing may carry a one-off cost)."""


class Exploration:
    """Probe spacing and the state it rests on. `probe_share`: the share of throughput probes
    may cost; `window`: how many ended requests tell whether probes' starts are repaid."""

    def __init__(self, probe_share: float, window: int) -> None:
        require(0 < probe_share <= 1, f"goodput probe_share must be in (0, 1], got {probe_share}")
        self.probe_share = probe_share
        self.probe_starts: deque[bool] = deque(maxlen=window)
        """Whether a plan went on to have each of the last requests a probe started draft."""
        self.idle = 0
        """Steps without drafting since the last drafting step."""
        self.hopeless = False
        """Whether drafts that are always accepted would not pay either, by the last plan's
        estimates (`due`): then no forecast is worth reading."""

    @staticmethod
    def choose(
        forecasts: Sequence[Sequence[float]], policies: Sequence[GoodputPolicy]
    ) -> list[int]:
        """A probe: one token for one row, with no confidence stop: a row already caught up if
        there is one (its step times drafting alone), else one that only resumes (a few tokens
        to catch up, not a prompt), each time the one forecast to accept best."""
        budgets = [0] * len(forecasts)
        candidates = [q for q, forecast in enumerate(forecasts) if forecast]
        if candidates:
            chosen = max(
                candidates,
                key=lambda q: (policies[q].drafted_last, policies[q].drafted_ever, forecasts[q][0]),
            )
            budgets[chosen] = 1
        return budgets

    def repaid(self) -> float:
        """The chance that a start a probe makes is repaid: that a plan goes on to have the
        request draft. Counted over the last requests a probe started, with two pseudo-requests
        that were (so before any ends, every start is taken as repaid)."""
        return (sum(self.probe_starts) + 2.0) / (len(self.probe_starts) + 2.0)

    def charge(self, policy: GoodputPolicy, catch_up: CatchUp) -> float:
        """Catch-up seconds a probe by this row is charged per step: a resume's spread over a
        spell; a start's spread over the steps it serves if a plan goes on to draft, whole if
        not, weighted by `repaid` (where drafting never pays, every probe's start is lost)."""
        spread = catch_up.charge(policy, whole=False)
        if not spread or policy.drafted_ever:
            return spread
        repaid = self.repaid()
        return repaid * spread + (1.0 - repaid) * catch_up.charge(policy, whole=True)

    def gap(
        self,
        costs: StepCosts,
        probe: Sequence[int],
        forecasts: Sequence[Sequence[float]],
        catch_up: Sequence[float],
    ) -> float:
        """Steps without drafting before this probe: what it is expected to lose, in plain
        steps (its seconds over a plain step's, less its tokens over a plain step's; by the
        current estimates, with the row's `catch_up` as given), over `probe_share` times the
        chance that what a probe starts a plan goes on to draft (`repaid`), at most
        MAX_PROBE_GAP. Counted in plain steps, not as a goodput ratio: a probe costing three
        plain steps loses two of them, where 1 − its goodput ratio would say 0.67."""
        if not any(probe):
            return math.inf
        q = probe.index(1)
        rows = len(probe)
        other = costs.other_seconds()
        plain_s = other + costs.verify(rows)
        seconds = other + costs.draft(probe) + catch_up[q] + costs.verify(rows + costs.nodes(1))
        loss = max(seconds / plain_s - (rows + forecasts[q][0]) / rows, 0.0)
        return min(loss / (self.probe_share * self.repaid()), MAX_PROBE_GAP)

    def due(
        self,
        costs: StepCosts,
        catch_up: CatchUp,
        long_run: AcceptanceByPosition,
        moot: bool,
        probe: Sequence[int],
        forecasts: Sequence[Sequence[float]],
        policies: Sequence[GoodputPolicy],
        charges: Sequence[float],
        remaining: Sequence[int] | None,
    ) -> float:
        """Idle steps due before the next probe. Where even drafts that are always accepted would
        not pay, acceptance is not worth learning: probe only every MAX_PROBE_GAP steps, to
        re-time drafting, once the probe's verification size is timed RETIME_SAMPLES times
        (before, at once). Otherwise at once while the batch-wide acceptance is unknown
        (EXPLORE_SAMPLES), then at `gap`, with the probing row's catch-up spread over the steps
        it serves (`charge`), even when plans finish a batch: a probe tests drafting for the
        rest of its request and the ones after, not to finish this batch sooner. `moot`: no
        target confidence could make the plan draft; `charges`: each row's catch-up as plans
        are charged it."""
        # Where some confidence would make a plan draft (not `moot`), sure drafts would too.
        perfect = [[1.0] * len(forecast) for forecast in forecasts]
        self.hopeless = moot and not any(optimal(costs, perfect, charges, remaining)[0])
        if self.hopeless:
            timed = costs.verify.measured(len(forecasts) + round(costs.nodes(1)))
            return MAX_PROBE_GAP if timed >= RETIME_SAMPLES else 0
        if long_run.tested_at(0) < EXPLORE_SAMPLES:
            return 0
        return self.gap(costs, probe, forecasts, [self.charge(p, catch_up) for p in policies])

    @staticmethod
    def deepen(
        costs: StepCosts,
        long_run: AcceptanceByPosition,
        budgets: list[int],
        caps: Sequence[int],
        forecasts: Sequence[Sequence[float]],
        catch_up: Sequence[float],
        remaining: Sequence[int] | None,
        serves: Sequence[float] | None = None,
        tested: Sequence[Sequence[float]] | None = None,
    ) -> list[int]:
        """One drafting row drafts one position past its plan while the long-run estimate has
        fewer than EXPLORE_SAMPLES tests of that position, if that position could pay: the plan
        with it always accepted must beat the plan without (`plan_value`). A position no plan
        reaches is never tested, and its forecast (the position before's) is often low; where
        even a sure position cannot pay, exploring it would be a pure loss."""
        value = None  # the plan's own, computed once a row is a candidate
        for q, (budget, cap) in enumerate(zip(budgets, caps, strict=True)):
            if 0 < budget < cap and long_run.tested_at(budget) < EXPLORE_SAMPLES:
                if value is None:
                    value = plan_value(
                        costs, budgets, forecasts, catch_up, remaining, serves, tested
                    )
                deeper = [b + (r == q) for r, b in enumerate(budgets)]
                sure = list(forecasts)
                sure[q] = [*forecasts[q][:budget], 1.0]
                if plan_value(costs, deeper, sure, catch_up, remaining, serves, tested) > value:
                    return deeper
        return budgets

    def retire(self, policy: GoodputPolicy) -> None:
        """A row's request has ended: whether a plan had it draft after a probe started it."""
        if policy.probe_started:
            self.probe_starts.append(policy.planned)
