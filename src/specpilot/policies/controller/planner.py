"""The goodput controller: before each step drafts, the budget of each row (docs/methods.md §7).
It forecasts each row's acceptance (acceptance.py), prices each candidate plan by what a step
costs (step_costs.py) and what rows pay to catch their drafter up (catch_up.py), searches the
plans (plan_search.py) and explores where its estimates would go stale (exploration.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from specpilot.errors import ConfigError
from specpilot.policies.base import DraftPolicy
from specpilot.policies.controller.acceptance import BatchAcceptance
from specpilot.policies.controller.catch_up import CatchUp
from specpilot.policies.controller.exploration import Exploration
from specpilot.policies.controller.plan_search import optimal
from specpilot.policies.controller.row_policy import GoodputPolicy
from specpilot.policies.controller.step_costs import StepCosts
from specpilot.types import StepRecord


@dataclass(frozen=True)
class PlanNote:
    """One plan, as `GoodputController.plan_observers` see it: before the rows' histories note
    it, so each policy still reads as it did when the plan was made."""

    policies: Sequence[GoodputPolicy]
    forecasts: list[list[float]] | None
    """Each row's a_1..a_cap; None where no row could draft (the plain step, not planned)."""
    budgets: list[int]
    remaining: Sequence[int] | None
    """Each row's remaining tokens where the plan finishes a batch, else None."""
    idle: int
    """Steps without drafting before this plan."""


PlanObserver = Callable[["GoodputController", PlanNote], None]


class GoodputController:
    """Plans each step's per-row draft budgets, maximising the expected tokens per second of the
    whole step,

        G(k_1..k_B) = Σ_q (1 + E[N_q | k_q]) / (T_other + T_draft(k) + T_verify(B + Σ_q fed(k_q))),

    or, where the caller waits for the batch's last row, the expected time until it finishes.
    Every term is learned from the steps' own timings and outcomes; a `specpilot profile`
    curve, when given (`verify_prior`, (tokens, seconds) points), is the prior. The all-zero plan
    (plain decoding) is always a candidate. One per engine: what it learns about the machine
    and the drafter carries over from request to request.

    `joint`: the drafter's forwards serve all drafting rows at once (draft-model or DVI chains);
    otherwise rows draft one after another (eagle, dynamic trees, n-gram lookup). `memory` and
    `strength`: the recent batch-wide acceptance's memory per row and the pseudo-steps of its
    prior; `window`: samples kept per timing; `probe_share`: throughput probes may cost.

    Losslessness: a budget is fixed before drafting from the past alone (the target's
    confidence included: it is read from steps already verified), as for any adaptive draft
    length (docs/methods.md §1.2). A row's budget depends on its batchmates' forecasts, so under
    sampling a batched row keeps the target's distribution but not its solo tokens (§1.3)."""

    def __init__(
        self,
        joint: bool,
        verify_prior: Iterable[tuple[float, float]] = (),
        window: int = 9,
        memory: float = 0.98,
        strength: float = 2.0,
        probe_share: float = 0.01,
    ) -> None:
        self.joint = joint
        self.exploration = Exploration(probe_share, window)
        self.costs = StepCosts(joint, verify_prior, window)
        self.batch = BatchAcceptance(memory, strength)
        self.catch_up = CatchUp(window)
        self.moot = False
        """Whether no target confidence could have made the last plan draft: then reading it is
        not worth its cost (`reads_target_confidence`)."""
        self.plan_observers: list[PlanObserver] = []
        """Called with each plan (PlanNote) once its budgets are chosen: traces, diagnostics."""

    def reset(self) -> None:
        """Nothing: the machine and the drafter do not change between requests."""

    @property
    def reads_target_confidence(self) -> bool:
        """Whether the engine should read the target's confidence for the next step: not where
        no confidence the rows could show would make a plan draft (`moot`, which the
        exploration's `hopeless` implies); reading it is a pass over the vocabulary per row."""
        return not self.moot

    def retire(self, policy: DraftPolicy) -> None:
        """A row's request has ended. Each request decodes with its own copy of the policy, so
        this is the only place its whole history is seen."""
        if not isinstance(policy, GoodputPolicy):
            return
        self.catch_up.retire(policy)
        self.exploration.retire(policy)

    def plan(
        self, policies: Sequence, caps: Sequence[int], remaining: Sequence[int] | None = None
    ) -> list[int]:
        """Final budgets (each 0..caps[q]) for rows whose policies and caps (the policy's budget
        within the row's room) are given; with each row's `remaining` tokens when the caller
        waits for the last row (finish_plan), else maximising tokens per second (best_plan).
        Until a drafting step has been timed, every step is a probe (an unknown T_draft is not
        free)."""
        missing = [p for p in policies if not isinstance(p, GoodputPolicy)]
        if missing:
            raise ConfigError(
                f"the goodput controller plans with GoodputPolicy rows, got {type(missing[0])}"
            )
        explore, idle = self.exploration, self.exploration.idle
        caps = [max(cap, 0) for cap in caps]
        if not any(caps) or not self.costs.verify.points():  # first time the plain step: the
            return self._chosen(PlanNote(policies, None, [0] * len(caps), remaining, idle))
        finish = remaining is not None and len(caps) > 1
        forecasts = self.batch.forecasts(policies, caps, finish)
        catch_up = [self.catch_up.charge(policy, whole=finish) for policy in policies]
        serves = self.catch_up.serves(policies) if finish else None
        probe = explore.choose(forecasts, policies)
        probing = not self.costs.draft.timed
        if probing:
            budgets, stop_gain = probe, 0.0
        else:
            mode = remaining if finish else None
            tested = None
            if finish:  # each forecast's verified count per position (finishing_steps)
                tested = [
                    [self.batch.counted_in(policy).tested_at(i) for i in range(len(forecast))]
                    for policy, forecast in zip(policies, forecasts, strict=True)
                ]
            self.moot = self._confidence_moot(policies, caps, catch_up, mode, serves, tested)
            budgets, stop_gain = [0] * len(caps), 0.0
            if not self.moot:
                budgets, stop_gain = optimal(self.costs, forecasts, catch_up, mode, serves, tested)
                budgets = explore.deepen(
                    self.costs, self.batch.long_run, budgets, caps, forecasts, catch_up, mode,
                    serves, tested,
                )  # fmt: skip
            explore.idle = 0 if any(budgets) else explore.idle + 1
            due = explore.due(
                self.costs, self.catch_up, self.batch.long_run, self.moot, probe, forecasts,
                policies, catch_up, mode,
            )  # fmt: skip
            probing = bool(explore.idle and explore.idle >= due)
            if probing:
                budgets, stop_gain, explore.idle = probe, 0.0, 0
        for policy, forecast in zip(policies, forecasts, strict=True):
            policy.prepare(forecast, stop_gain, self.batch.calibration)
        return self._chosen(PlanNote(policies, forecasts, budgets, remaining, idle), probing)

    def _confidence_moot(
        self,
        policies: Sequence[GoodputPolicy],
        caps: Sequence[int],
        catch_up: Sequence[float],
        remaining: Sequence[int] | None,
        serves: Sequence[float] | None,
        tested: Sequence[Sequence[float]] | None,
    ) -> bool:
        """Whether no plan would draft even if every row showed the target confidence the
        calibration rates highest. A row's forecast grows with its prior's a_1, and a plan with
        higher forecasts drafts at least as much (exactly when maximising tokens per second;
        nearly when finishing a batch), so then the rows' own plan drafts nothing (it is not
        computed), and the next step's confidence reading could not have changed it."""
        best = self.batch.forecasts(policies, caps, remaining is not None, most_confident=True)
        return not any(optimal(self.costs, best, catch_up, remaining, serves, tested)[0])

    def _chosen(self, note: PlanNote, probing: bool = False) -> list[int]:
        for observer in self.plan_observers:
            observer(self, note)
        self.note_plan(note.policies, note.budgets, probing)
        return note.budgets

    def note_plan(
        self, policies: Sequence[GoodputPolicy], budgets: Sequence[int], probing: bool = False
    ) -> None:
        """Note which rows draft now (`probing`: as a probe) in the rows' histories, and which
        start or resume: their step times that catch-up as well as drafting, so it teaches the
        catch-up cost, not T_draft (`observe`)."""
        self.catch_up.note_plan(policies, budgets)
        self.batch.note_plan(policies)
        for policy, budget in zip(policies, budgets, strict=True):
            policy.note_budget(budget, probing)

    def observe(
        self,
        budgets: Sequence[int],
        records: Sequence[StepRecord],
        draft_s: float,
        verify_s: float,
        step_s: float,
    ) -> None:
        """One finished step: the budgets planned, each row's record, and the seconds spent
        drafting (with selection: SV's companion), in the target forward, and in all."""
        catching_up = self.catch_up.catching_up
        if catching_up:
            self.catch_up.learn(max(draft_s - self.costs.timed_draft(budgets), 0.0))
        other_s = max(step_s - draft_s - verify_s, 0.0)
        self.costs.learn(budgets, records, None if catching_up else draft_s, verify_s, other_s)
        self.batch.learn(records)
