"""The goodput controller's parts: the planner's math, the latency curves it learns from the
steps' timings, the acceptance it forecasts, its probes, and how it is built by name."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from tiny import save_tiny

from specpilot.api import build_engine, load_models
from specpilot.cli import main
from specpilot.config import GenerationConfig
from specpilot.errors import ConfigError
from specpilot.methods import make_policy
from specpilot.methods.goodput import make_goodput, profile_cache_path
from specpilot.policies.controller import (
    EXPLORE_SAMPLES,
    MAX_PROBE_GAP,
    PRIOR_ACCEPTANCE,
    RESUME_HORIZON,
    SAMPLE_AGE,
    AcceptanceByPosition,
    ConfidenceCalibration,
    GoodputController,
    GoodputPolicy,
    finishing_catch_up,
    finishing_quantile,
    finishing_steps,
)
from specpilot.policies.goodput import allocate_batch, expected_accepted, marginal_order
from specpilot.policies.latency import LatencyCurve
from specpilot.types import StepRecord


def controller(
    verify, draft=lambda u: 1e-9 * u, joint=True, other=0.0, forward=None
) -> GoodputController:
    """A controller that has learned T_verify = verify(n) for n = 1..300, T_draft = draft(u)
    for u = 1..16 (a time of 0 is not a sample; joint: a forward over any rows costs draft(1))
    or, joint with `forward`, a forward over r rows forward(r) for r = 1..8, and `other`
    seconds per step."""
    c = GoodputController(joint=joint)
    for n in range(1, 301):
        c.verify.add(n, verify(n))
    if forward is None:
        for u in range(1, 17):
            c.draft.add([u], draft(u))
    else:
        for r in range(1, 9):
            c.draft.add([1] * r, forward(r))
    c.other.append(other)
    return c


def goodput(c: GoodputController, forecasts, budgets) -> float:
    """G of a plan, computed directly from its definition."""
    rows = len(budgets)
    expected = rows + sum(expected_accepted(f, k) for f, k in zip(forecasts, budgets, strict=True))
    fed = rows + sum(c.nodes(k) for k in budgets)
    return expected / (c.other[0] + c.draft(budgets) + c.verify(fed))


def test_picks_zero_when_verification_is_dear_and_acceptance_low():
    c = controller(lambda n: 0.01 * n, draft=lambda u: 0.002 * u)
    assert c.best_plan([[0.3] * 6, [0.2] * 6])[0] == [0, 0]


def test_picks_long_drafts_when_verification_is_flat_and_acceptance_high():
    c = controller(lambda n: 0.01 + 1e-5 * n, draft=lambda u: 0.0005 * u)
    assert c.best_plan([[0.95] * 8])[0] == [8]
    assert c.best_plan([[0.95] * 8, [0.9] * 8])[0] == [8, 8]


def test_respects_each_rows_cap():
    """A row's forecast is as long as it may draft (its room), and a cap of 0 drafts nothing."""
    c = controller(lambda n: 0.01 + 1e-5 * n)
    assert c.best_plan([[0.9] * 2, [0.9] * 5, []])[0] == [2, 5, 0]
    policies = [GoodputPolicy(max_k=6) for _ in range(3)]
    assert c.plan(policies, [1, 0, 6]) == [1, 0, 6]


def test_weak_rows_wait_while_strong_rows_draft():
    """With verification charged per token, only the rows whose drafts are likely accepted
    draft, and the strong row drafts further than the middling one."""
    c = controller(lambda n: 0.01 + 0.002 * n)
    plan = c.best_plan([[0.1] * 6, [0.95] * 6, [0.7] * 6])[0]
    assert plan[0] == 0 and plan[1] > plan[2] > 0


@pytest.mark.parametrize("drafting", ["joint", "row by row", "joint, by rows"])
def test_plan_is_the_best_of_all_plans(drafting):
    """Exhaustive check on small batches: the scan in marginal order finds the maximum of G,
    also when a joint draft forward costs more the more rows it serves (as the 0.5B draft's:
    63 ms for one row, 81 for eight)."""
    rng = random.Random(0)
    for trial in range(30):
        slope, step = rng.choice([1e-4, 2e-3, 1e-2]), rng.choice([0.0, 1e-3, 5e-3])
        verify = lambda n, s=slope: 0.01 + s * n  # noqa: E731
        if drafting == "joint, by rows":
            first = step or 1e-3
            per_row = rng.choice([0.03, 0.2, 1.0]) * first
            c = controller(verify, forward=lambda r, f=first, p=per_row: f + p * (r - 1))
        else:
            c = controller(verify, lambda u, d=step: d * u, joint=drafting == "joint")
        forecasts = [
            sorted((rng.random() for _ in range(rng.randint(0, 3))), reverse=True) for _ in range(3)
        ]
        plan = c.best_plan(forecasts)[0]
        best = max(
            goodput(c, forecasts, [a, b, d])
            for a in range(len(forecasts[0]) + 1)
            for b in range(len(forecasts[1]) + 1)
            for d in range(len(forecasts[2]) + 1)
        )
        assert goodput(c, forecasts, plan) == pytest.approx(best, rel=1e-9), (trial, plan)


def test_joint_draft_cost_is_one_forward_per_position_over_the_rows_still_drafting():
    """T_draft of a joint drafter: Σ over positions of F(rows drafting that position), F learned
    per rows a forward serves, so one-row probes do not unlearn what eight rows cost."""
    c = GoodputController(joint=True)
    assert not c.draft.timed and c.draft([2, 2]) == 0.0  # unknown: optimistic, then timed
    for _ in range(3):
        c.draft.add([1] * 8, 0.081)
        c.draft.add([1] + [0] * 7, 0.063)
        c.draft.add([0, 1] + [0] * 6, 0.063)
    assert c.draft([1] * 8) == pytest.approx(0.081)
    assert c.draft([1] + [0] * 7) == pytest.approx(0.063)
    assert c.draft([2] * 8) == pytest.approx(2 * 0.081)
    assert c.draft([2, 1, 0, 0]) == pytest.approx(c.draft.forwards(2)[2] + 0.063)
    # beyond the rows timed, the slope over them (the 0.5B's sixteen rows: 104 ms measured)
    assert c.draft([1] * 16) == pytest.approx(0.081 + 8 * 0.018 / 7)
    c.draft.add([3, 3, 0], 3 * 0.065)  # a step: its mean rows per forward, its time per forward
    assert c.draft.curve.measured(2) == 1
    last = [0, 0, 0, 0]
    tally = c.draft.tally(4)  # the plan searches' running total, a position at a time
    for budgets in ([1, 0, 0, 0], [1, 1, 0, 0], [2, 1, 0, 0], [2, 1, 1, 0], [2, 2, 1, 0]):
        q = next(q for q, (b, a) in enumerate(zip(budgets, last, strict=True)) if b > a)
        assert tally.grow(budgets[q]) == pytest.approx(c.draft(budgets))
        last = budgets


def test_joint_drafting_cost_follows_the_deepest_budget():
    """A joint drafter pays per draft forward, whatever the number of rows drafting: a draft
    step costing half a target step pays for a batch drafting together, not when each row's
    tokens cost a forward of their own."""
    verify = lambda n: 0.01 + 1e-5 * n  # noqa: E731
    draft = lambda u: 0.005 * u  # noqa: E731
    assert 0 not in controller(verify, draft, joint=True).best_plan([[0.8] * 4] * 8)[0]
    assert controller(verify, draft, joint=False).best_plan([[0.8] * 4] * 8)[0] == [0] * 8


def test_marginal_order_keeps_sv_allocation():
    """allocate_batch (SV) walks marginal_order and still stops at the first non-improving step."""
    p = [[0.9, 0.8, 0.1], [0.5, 0.4]]
    order = [(q, round(g, 6)) for q, g, _ in marginal_order(p)]
    assert order == [(0, 0.9), (0, 0.72), (1, 0.5), (1, 0.2), (0, 0.072)]
    assert allocate_batch(p, lambda n: 1.0 + 0.1 * n) == [2, 1]


def test_latency_curve_learns_from_noisy_synthetic_timings():
    """T(n) = 10 ms + 1 ms·n measured with noise and 10 % of steps slowed 5x by another process:
    the medians ignore the slow steps, the fit is non-decreasing, and reads between sizes."""
    rng = random.Random(1)
    curve = LatencyCurve(window=15)
    for _ in range(20):
        for n in (1, 2, 4, 8, 16, 32):
            t = (0.010 + 0.001 * n) * rng.uniform(0.95, 1.05)
            curve.add(n, t * (5 if rng.random() < 0.1 else 1))
    for n in (1, 3, 6, 12, 24, 32):
        assert curve(n) == pytest.approx(0.010 + 0.001 * n, rel=0.08)
    values = [curve(n) for n in range(1, 64)]
    assert values == sorted(values)
    assert curve(64) == pytest.approx(0.074, rel=0.1)  # the measured slope, beyond the range
    assert curve(0.5) == curve(1)


def test_latency_curve_is_monotone_and_scales_its_prior():
    curve = LatencyCurve(prior=[(1, 1.0), (2, 1.1), (4, 1.2), (8, 2.0)])
    assert curve(3) == pytest.approx(1.15)
    curve.add(1, 2.0)
    curve.add(2, 2.2)  # the machine is twice as slow now: unmeasured sizes follow
    assert curve(8) == pytest.approx(4.0)
    curve.add(4, 1.0)  # 1 and 2 tokens timed slower than 4 were slowed: 4's time bounds them
    points = curve.points()
    assert [t for _, t in points] == sorted(t for _, t in points)
    assert curve(1) == curve(2) == pytest.approx(1.0)
    assert curve(8) == pytest.approx(2.0 / 1.1)  # the prior, scaled by the median ratio
    with pytest.raises(ValueError, match="no verify latency"):
        LatencyCurve()(1)


def test_of_two_timings_the_curve_takes_the_faster():
    """A CPU's timing noise is one-sided (other work, a new shape's first forward), so of an even
    count the lower middle sample is the size's estimate; from three on, the median."""
    curve = LatencyCurve()
    curve.add(2, 0.206)
    curve.add(3, 0.305)  # the first forward of a new shape
    curve.add(3, 0.209)
    assert curve(3) == pytest.approx(0.209)
    curve.add(3, 0.210)
    assert curve(3) == pytest.approx(0.210)


def test_a_size_timed_slow_while_the_machine_was_busy_does_not_flatten_the_curve():
    """At batch 2 on the AVX2-only CPU (BENCHMARKS §10.19) the plain 2-token step, timed once
    per request, was timed while another process ran: 741 ms, where 3 and 4 tokens took 450 ms
    later, 5 took 555 and 6 took 678. The larger sizes bound it: T(2) reads as T(3), and T(5),
    T(6) keep their own times (pooled, all of 2..6 had read 725 ms, and
    drafting two tokens in both rows looked as cheap as a plain step)."""
    curve = LatencyCurve()
    curve.add(1, 0.416)
    for _ in range(3):
        curve.add(2, 0.741)
    for _ in range(9):
        curve.add(3, 0.450)
        curve.add(4, 0.452)
    curve.add(5, 0.555)
    curve.add(5, 0.556)
    curve.add(6, 0.678)
    assert curve(2) == pytest.approx(0.450)
    assert curve(5) == pytest.approx(0.555) and curve(6) == pytest.approx(0.678)
    assert curve(1) == pytest.approx(0.416)


def test_a_curve_forgets_timings_older_than_its_max_age():
    """Age counts the curve's samples of any size: a size not timed again for max_age samples
    is unmeasured again and reads from its neighbours (beyond the last, their slope)."""
    curve = LatencyCurve(max_age=4)
    curve.add(1, 0.40)
    curve.add(4, 1.50)  # timed once, under load
    for _ in range(2):
        curve.add(2, 0.45)
        curve.add(3, 0.45)
    assert curve.measured(4) == 0 and curve.measured(1) == 0 and curve.measured(3) == 2
    assert curve(4) == pytest.approx(0.45)
    assert LatencyCurve(window=3).measured(4) == 0
    with pytest.raises(ConfigError, match="max_age"):
        LatencyCurve(max_age=0)


def test_draft_curve_is_proportional():
    curve = LatencyCurve(proportional=True)
    assert curve(3) == 0.0  # nothing measured: optimistic, so drafting gets tried
    curve.add(2, 0.02)
    assert curve(0) == 0.0 and curve(1) == pytest.approx(0.01) and curve(6) == pytest.approx(0.06)


def test_acceptance_by_position_counts_only_tested_positions():
    acceptance = AcceptanceByPosition(memory=0.5)
    acceptance.add(verified=4, accepted=1)  # position 1 accepted, 2 rejected, 3-4 untested
    assert acceptance.tested == [1.0, 1.0] and acceptance.accepted == [1.0, 0.0]
    acceptance.add(verified=0, accepted=0)  # a step that drafted nothing: only forgetting
    assert acceptance.tested == [0.5, 0.5]
    a = acceptance.estimates(3, None, strength=1.0)
    assert a[0] == pytest.approx((0.5 + PRIOR_ACCEPTANCE) / 1.5)
    assert a[2] == pytest.approx(a[1])  # untested: the position before's estimate
    assert acceptance.estimates(2, [0.9, 0.9], strength=1.0)[1] == pytest.approx(0.9 / 1.5)


def test_row_policy_learns_its_acceptance_and_resets():
    policy = GoodputPolicy(max_k=4, memory=0.95)
    for _ in range(40):  # a row's own text outweighs the batch-wide prior (8 pseudo-steps)
        policy.observe(StepRecord(4, 4, 4, 5, 0.0, 0.0, 10, 4))
    assert min(policy.forecast([0.1] * 4)) > 0.7
    policy.reset()
    assert policy.forecast([0.1] * 4) == pytest.approx([0.1] * 4)
    with pytest.raises(ConfigError, match="max_k"):
        GoodputPolicy(max_k=0)


def test_confidence_calibration_learns_acceptance_by_confidence():
    calibration = ConfidenceCalibration(bins=4, memory=1.0, strength=2.0)
    for _ in range(50):
        calibration.add(0.1, accepted=False)
        calibration.add(0.9, accepted=True)
    assert calibration.acceptance(0.2, prior=0.5) < 0.05
    assert calibration.acceptance(0.95, prior=0.5) > 0.95
    assert calibration.acceptance(0.6, prior=0.5) == 0.5  # nothing seen: the prior


def test_low_draft_confidence_stops_drafting_before_the_token():
    calibration = ConfidenceCalibration(bins=4, memory=1.0)
    for _ in range(50):
        calibration.add(0.1, accepted=False)
        calibration.add(0.9, accepted=True)
    sure, unsure = torch.zeros(8), torch.zeros(8)  # top probabilities 0.98 and 0.14
    sure[0], unsure[0] = 8.0, 0.1
    policy = GoodputPolicy(max_k=4)
    assert policy.admits(unsure)  # no controller: no confidence stop
    policy.prepare([0.8] * 4, 0.3, calibration)
    assert policy.admits(sure) and policy.admits(sure)
    assert not policy.admits(unsure)
    policy.prepare([0.8] * 4, 0.0, calibration)  # verification free: never stop
    assert policy.admits(unsure)
    # the verified outcome calibrates: position 1 accepted, 2 rejected
    policy.prepare([0.8] * 4, 0.0, calibration)
    assert policy.admits(sure) and policy.admits(sure)
    before = list(calibration.tested)
    policy.observe(StepRecord(2, 2, 1, 2, 0.0, 0.0, 9, 2))
    assert sum(calibration.tested) == sum(before) + 2 and policy.confidences == []


def test_stop_gain_is_what_a_position_costs_at_the_planned_goodput():
    flat = controller(lambda n: 0.01, draft=lambda u: 0.0)
    assert flat.best_plan([[0.9] * 4])[1] == 0.0
    steep = controller(lambda n: 0.01 + 0.001 * n)
    budgets, stop_gain = steep.best_plan([[0.9] * 4])
    assert stop_gain == pytest.approx(goodput(steep, [[0.9] * 4], budgets) * 0.001)


def test_first_step_is_plain_and_idle_steps_lead_to_a_probe():
    c = GoodputController(joint=True)
    policies = [GoodputPolicy(max_k=4) for _ in range(2)]
    assert c.plan(policies, [4, 4]) == [0, 0]  # nothing measured: the plain step first
    c.observe([0, 0], [StepRecord(0, 0, 0, 1, 0.0, 0.0, 5, 0)] * 2, 0.0, 1.0, 1.0)
    c.draft.add([1], 0.5)  # drafting does not pay (it would if every draft were accepted)
    c.long_run.tested = [EXPLORE_SAMPLES]  # and the acceptance is known
    c.long_run.accepted = [EXPLORE_SAMPLES / 2]
    c.probe_share = 0.2
    # a probe: 2.5 expected tokens in 0.5 + 1 s against 2 in 1 s loses 1.5 − 1.25 = 0.25 plain
    # steps, which at probe_share 0.2 makes every second step without drafting a probe
    plans = [c.plan(policies, [4, 4]) for _ in range(4)]
    assert plans == [[0, 0], [1, 0], [0, 0], [1, 0]]
    assert c.plan(policies, [0, 0]) == [0, 0]


def test_probes_are_frequent_where_drafting_nearly_pays():
    c = GoodputController(joint=True)
    c.verify.add(1, 1.0)
    c.verify.add(2, 1.0)
    probe, catch_up = [1], [0.0]
    c.draft.add([1], 0.6)  # 1.5 tokens in 1.6 s: loses 0.1 of a plain step
    assert c.probe_gap(probe, [[0.5]], catch_up) == pytest.approx((1.6 - 1.5) / 0.01)
    c.draft.add([1], 2.0)
    c.draft.add([1], 2.0)  # far off: 1.5 tokens in 3 s, 1.5 plain steps lost, rare
    assert c.probe_gap(probe, [[0.5]], catch_up) == pytest.approx((3.0 - 1.5) / 0.01)
    c.probe_share = 0.001
    assert c.probe_gap(probe, [[0.5]], catch_up) == MAX_PROBE_GAP
    assert c.probe_gap([0], [[]], catch_up) == float("inf")
    with pytest.raises(ConfigError, match="GoodputPolicy"):
        c.plan([object(), object()], [4, 4])


def test_no_probes_where_even_drafts_always_accepted_would_not_pay():
    """Where the verify curve and the draft cost alone rule drafting out (each verified token
    costs a plain step), acceptance is not worth learning: no exploring, a probe only every
    MAX_PROBE_GAP idle steps to re-time drafting, once the probe's size is timed twice (one
    timing may be a new shape's one-off cost: until then a probe re-times it at once). With a
    flat curve the same controller explores."""
    policies = [GoodputPolicy(max_k=4) for _ in range(4)]
    steep = controller(lambda n: 0.1 * n, draft=lambda u: 0.01 * u)
    assert steep.long_run.tested_at(0) < EXPLORE_SAMPLES
    assert sum(steep.plan(policies, [4] * 4)) == 1  # T_verify(5) was timed once: re-timed
    steep.verify.add(5, 0.5)
    assert all(steep.plan(policies, [4] * 4) == [0] * 4 for _ in range(20))
    steep.idle = MAX_PROBE_GAP - 1
    assert sum(steep.plan(policies, [4] * 4)) == 1
    flat = controller(lambda n: 0.1 + 0.02 * n, draft=lambda u: 0.08 * u)
    flat.acceptance.add(1, 0)  # one rejection: drafting looks poor, but is still unknown
    assert flat.best_plan([f[:4] for f in [[0.1] * 4] * 4])[0] == [0] * 4
    assert sum(flat.plan(policies, [4] * 4)) == 1


def test_a_new_requests_probe_prices_its_prompt_read_as_plans_do():
    """A server at concurrency 1 on the AVX2-only CPU (BENCHMARKS §10.20): a plain step 497 ms,
    a draft step 200 ms, the draft model's read of a new request's prompt 817 ms, first
    positions accepted 47 % (one drafted token at break-even, so the plan drafts nothing). Plans
    spread that read over the steps rows go on drafting; priced whole, the probe lost 1.6 plain
    steps and came every 158 idle steps, longer than a 64-token request, so the next three
    requests were not tried. Priced as plans price it, a probe comes within a few idle steps; and
    so it does when finishing a batch, where plans pay a catch-up whole but a probe still tests
    drafting for the rest of its request and the ones after (at batch 2 in bf16, priced whole,
    a probe was due after ~110 idle steps and 48-token requests went undrafted, §10.24)."""
    c = controller(lambda n: 0.497, draft=lambda u: 0.2 * u)
    c.long_run.tested, c.long_run.accepted = [100.0], [47.0]
    c.start.append(0.817)
    policies = [GoodputPolicy(max_k=4) for _ in range(2)]
    for policy in policies:
        policy.opening = False
    plans = [c.plan(policies[:1], [4]) for _ in range(8)]
    assert plans[0] == [0] and [1] in plans
    fresh = [GoodputPolicy(max_k=4) for _ in range(2)]  # both rows would read their prompt
    for policy in fresh:
        policy.opening = False
    c.idle = 0
    plans = [c.plan(fresh, [4, 4], remaining=[40, 40]) for _ in range(40)]  # whole: 181 steps
    assert plans[0] == [0, 0] and any(sum(plan) == 1 for plan in plans)


def test_steps_that_catch_the_drafter_up_teach_the_catch_up_cost_not_draft_time():
    """A row drafting first feeds its draft model what it missed (the prompt on its first
    drafting step, the tokens accepted meanwhile when it resumes): timing that as drafting would
    make the probes after an idle spell look expensive, and the controller would never draft
    again. It is the start or resume cost instead, learned per row."""
    c = GoodputController(joint=True)
    c.verify.add(1, 1.0)
    policies = [GoodputPolicy(max_k=4)]
    record = StepRecord(1, 1, 1, 2, 0.0, 0.0, 9, 1)
    first = c.plan(policies, [4])
    assert first == [1] and c.starting == 1  # T_draft unknown: a one-token probe
    c.observe(first, [record], draft_s=5.0, verify_s=1.0, step_s=6.0)  # the prompt's catch-up
    assert c.draft.curve.measured(1) == 0 and list(c.start) == [5.0] and not c.resume
    second = c.plan(policies, [4])
    assert second == [1] and c.starting == c.resuming == 0  # the caught-up row probes again
    c.observe(second, [record], draft_s=0.2, verify_s=1.0, step_s=1.2)
    assert c.draft([1]) == pytest.approx(0.2)
    c.draft.add([1], 10.0)
    c.draft.add([1], 10.0)  # drafting now looks hopeless: the row stops, then resumes with a probe
    c.long_run.tested, c.long_run.accepted = [EXPLORE_SAMPLES], [EXPLORE_SAMPLES / 2]
    assert c.plan(policies, [4]) == [0] and not policies[0].drafted_last
    c.idle = MAX_PROBE_GAP  # after a long idle spell, the next idle step probes
    assert c.plan(policies, [4]) == [1] and c.resuming == 1
    c.observe([1], [record], draft_s=10.0 + 3.0, verify_s=1.0, step_s=14.0)
    assert list(c.resume) == [3.0]  # the catch-up beyond T_draft(1)
    assert c.catch_up(GoodputPolicy()) == 5.0 and c.catch_up(policies[0]) == 0.0


def test_a_probe_drafts_one_row_and_prefers_one_caught_up():
    """In a batch, a probe pays one row's catch-up, not every row's."""
    c = GoodputController(joint=True)
    c.verify.add(3, 1.0)
    policies = [GoodputPolicy(max_k=4) for _ in range(3)]
    assert c.plan(policies, [4, 4, 4]) == [1, 0, 0]  # T_draft unknown: probe
    assert c.plan(policies, [4, 4, 4]) == [1, 0, 0]  # the same row, now caught up
    assert c.plan(policies, [4, 0, 4]) == [1, 0, 0]
    policies[0].spell = 0  # row 0 did not draft on its last step, row 2 did
    policies[2].spell = 1
    assert c.plan(policies, [4, 4, 4]) == [0, 0, 1]
    policies[2].spell = 0  # no row is caught up: one that resumes, not one starting
    assert c.plan(policies, [4, 4, 4]) == [1, 0, 0]


def test_resuming_rows_pay_their_catch_up_in_the_plan():
    """Warm rows draft where drafting pays; cold rows wait while one step's share of their
    catch-up costs more than drafting brings, and resume when it is cheap."""
    c = controller(lambda n: 0.1 + 0.002 * n, draft=lambda u: 0.01 * u)
    forecasts = [[0.8] * 4, [0.8] * 4]
    warm = c.best_plan(forecasts, [0.0, 0.0])[0]
    assert all(k > 0 for k in warm)
    dear = 1.0  # seconds charged per step for each row catching up
    assert c.best_plan(forecasts, [dear, dear])[0] == [0, 0]
    assert c.best_plan(forecasts, [0.0, dear])[0] == [warm[0], 0]
    cheap = 1e-4
    assert c.best_plan(forecasts, [cheap, cheap])[0] == warm


def test_a_catch_up_is_spread_over_the_spells_rows_keep():
    """Rows that stop drafting after a step or two pay a catch-up whole: a plan is charged a
    catch-up over the median spell rows ended lately (RESUME_HORIZON before any, and at most),
    counting spells that ended with their request."""
    c = controller(lambda n: 0.1 + 0.002 * n, draft=lambda u: 0.01 * u)
    forecasts = [[0.8] * 4, [0.8] * 4]
    c.start.append(0.4)  # seconds per row: worth it over 16 steps, not over one
    policies = [GoodputPolicy(max_k=4) for _ in range(2)]
    charges = [c.charge(policy, whole=False) for policy in policies]
    assert c.horizon() == RESUME_HORIZON and charges == [0.4 / RESUME_HORIZON] * 2
    assert all(c.best_plan(forecasts, charges)[0])
    assert [c.charge(policy, whole=True) for policy in policies] == [0.4, 0.4]
    c._remember(policies, [1, 1])
    c._remember(policies, [0, 1])  # row 0 ends a one-step spell
    assert list(c.spells) == [1] and c.horizon() == 1.0
    fresh = [GoodputPolicy(max_k=4) for _ in range(2)]
    assert c.best_plan(forecasts, [c.charge(policy, whole=False) for policy in fresh])[0] == [0, 0]
    c.retire(policies[1])  # row 1's request ends two steps into its spell
    policies[1].reset()
    assert list(c.spells) == [1, 2] and c.horizon() == 1.5
    for _ in range(40):
        c._remember(policies, [1, 1])
    for policy in policies:
        c.retire(policy)
    assert c.horizon() == RESUME_HORIZON  # median of 1, 2, 40, 40, capped


def test_a_start_is_spread_over_the_steps_its_request_drafts_in_all():
    """A start reads the prompt into the draft model once and serves every later spell, which
    resumes for a few tokens: it is charged over the steps requests drafted on in all, not over
    one spell. The server at concurrency 1 on the AVX2-only CPU (BENCHMARKS §10.20): a first
    request at break-even drafted 37 of its steps in spells of 3-4, and the next requests' starts
    (817 ms) were charged a third of their cost per step; a resume stays priced per spell."""
    c = controller(lambda n: 0.497 + 0.06 * (n - 1), draft=lambda u: 0.2 * u)
    c.start.append(0.817)
    c.resume.append(0.3)
    first, second = GoodputPolicy(max_k=4), GoodputPolicy(max_k=4)
    assert c.start_horizon() == c.horizon() == RESUME_HORIZON  # no request has ended yet
    for spell in [4, 3, 12, 3, 4, 3, 2, 3, 3]:  # 37 drafted steps in spells of 3 or so
        for budget in [1] * spell + [0]:
            c._remember([first], [budget])
    assert c.horizon() == 3.0 and first.drafted_steps == 37
    assert c.charge(second, whole=False) == pytest.approx(0.817 / 3.0)  # before: one spell's
    c.retire(first)  # its request ends
    assert list(c.lifetimes) == [37] and c.start_horizon() == 37.0
    assert c.charge(second, whole=False) == pytest.approx(0.817 / 37.0)
    assert c.charge(second, whole=True) == pytest.approx(0.817)
    second.drafted_ever = True  # it has read its prompt: resumes are charged per spell
    assert c.charge(second, whole=False) == pytest.approx(0.3 / 3.0)
    forecast = [[0.7, 0.7]]  # drafting pays with a start charged over 37 steps, not over 3
    assert c.best_plan(forecast, [0.817 / 37.0])[0] == [1]
    assert c.best_plan(forecast, [0.817 / 3.0])[0] == [0]


def test_finishing_a_batch_follows_the_row_that_needs_most_steps():
    """When the caller waits for the last row, a row that is ahead gains nothing by drafting:
    only the rows that would finish last draft."""
    c = controller(lambda n: 0.1 + 0.002 * n, draft=lambda u: 0.01 * u)
    forecasts = [[0.8] * 4, [0.8] * 4, [0.8] * 4]
    budgets, stop_gain = c.finish_plan(forecasts, [0.0] * 3, remaining=[40, 5, 40])
    assert budgets[1] == 0 and budgets[0] > 0 and budgets[2] > 0 and stop_gain > 0
    assert c.best_plan(forecasts)[0][1] > 0  # tokens per second would draft it too


def test_finishing_a_batch_waits_for_its_worst_row_and_pays_catch_up_once():
    """A batch drafts only if its slowest row gains enough to pay every drafting row's cost,
    and a catch-up is charged whole: worth it over many steps, not over a few."""
    c = controller(lambda n: 0.1 + 0.01 * n, draft=lambda u: 0.02 * u)
    good, poor = [0.8] * 4, [0.15] * 4
    assert any(c.finish_plan([good, good], [0.0, 0.0], [40, 40])[0])
    assert c.finish_plan([good, poor], [0.0, 0.0], [40, 40])[0] == [0, 0]
    assert any(c.best_plan([good, poor])[0])  # per second the good row alone pays
    assert any(c.finish_plan([good, good], [0.5, 0.5], [40, 40])[0])
    assert c.finish_plan([good, good], [0.5, 0.5], [4, 4])[0] == [0, 0]


def test_finishing_a_batch_plans_for_its_slowest_row_not_its_average_one():
    """At batch 8 drafting one token that pays 9 % per step at the rows' mean acceptance (0.72)
    loses once the batch waits for its slowest row (BENCHMARKS §10.8: 31 and 32 steps for 48
    tokens where rows took 28 on average): with no steps of their own the rows' forecasts count
    as uncertain, and the batch decodes plainly; rows known from many steps draft again, but
    their outcomes still vary, so a smaller margin no longer pays (§10.27)."""
    c = controller(lambda n: 0.221 + 0.0015 * n, draft=lambda u: 0.12 * u)
    forecasts, remaining = [[0.72]] * 8, [48] * 8
    assert c.finish_plan(forecasts, [0.0] * 8, remaining, tested=[[0.0]] * 8)[0] == [0] * 8
    assert c.finish_plan(forecasts, [0.0] * 8, remaining, tested=[[500.0]] * 8)[0] == [1] * 8
    z = finishing_quantile(8)
    assert finishing_steps([0.72], [0.0], 48, z)[1] == pytest.approx(31.3, abs=0.05)
    known = finishing_steps([0.72], [500.0], 48, z)[1]
    assert 27.9 < known < 30  # the mean 48 / 1.72 = 27.9, plus the outcomes' spread
    assert finishing_steps([0.72], [0.0], 48, finishing_quantile(1)) == [48.0, 48 / 1.72]
    dearer = controller(lambda n: 0.221 + 0.0015 * n, draft=lambda u: 0.14 * u)
    assert dearer.finish_plan(forecasts, [0.0] * 8, remaining, tested=[[500.0]] * 8)[0] == [0] * 8
    assert dearer.finish_plan(forecasts, [0.0] * 8, remaining)[0] == [0] * 8  # exact: still


def test_finishing_steps_spread_matches_simulated_rows():
    """finishing_steps' quantile against simulation: the most steps of B rows that each emit
    1 + N tokens a step, N the accepted run of a chain with known acceptance."""
    rng = random.Random(0)
    forecast, remaining, rows = [0.8, 0.7, 0.6], 48, 8
    for budget in (1, 3):
        most = []
        for _ in range(2000):
            worst = 0
            for _ in range(rows):
                emitted = steps = 0
                while emitted < remaining:
                    n = 0
                    while n < budget and rng.random() < forecast[n]:
                        n += 1
                    emitted, steps = emitted + 1 + n, steps + 1
                worst = max(worst, steps)
            most.append(worst)
        predicted = finishing_steps(forecast, None, remaining, finishing_quantile(rows))[budget]
        assert predicted == pytest.approx(sum(most) / len(most), rel=0.06), budget


def test_observe_learns_verify_draft_and_tree_width():
    c = GoodputController(joint=False)
    c.plan([GoodputPolicy(), GoodputPolicy()], [3, 0])  # the step observed below
    records = [StepRecord(3, 3, 1, 2, 0.0, 0.0, 9, 6), StepRecord(0, 0, 0, 1, 0.0, 0.0, 9, 0)]
    c.observe([3, 0], records, draft_s=0.3, verify_s=0.5, step_s=1.0)
    assert c.verify.measured(2 + 6) == 1 and c.draft([3]) == pytest.approx(0.3)
    assert c.other[0] == pytest.approx(0.2)
    assert c.fed_per_depth == pytest.approx(0.9 + 0.1 * 2)  # 6 tree nodes for 3 drafted levels
    assert c.nodes(3) == 6 and c.nodes(2) == pytest.approx(2 * c.fed_per_depth)


def test_a_tree_of_fixed_size_drafts_as_deep_as_it_may():
    """A tree verifies 8 nodes at depth 1 and 16 at any depth beyond: past depth 2 going deeper
    costs no verification, so the plan uses the whole cap."""
    c = controller(lambda n: 0.01 + 2e-4 * n, draft=lambda u: 1e-4 * u, joint=False)
    c.nodes_by_budget = {1: 8.0, **{k: 16.0 for k in range(2, 9)}}
    assert c.best_plan([[0.7] * 6])[0] == [6]
    c.nodes_by_budget = {k: 8.0 * k for k in range(1, 9)}  # a tree growing 8 nodes per level
    assert c.best_plan([[0.7] * 6])[0] < [6]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = save_tiny(tmp_path_factory.mktemp("goodput") / "target", seed=0)
    return load_models(str(folder), None, "float32", "cpu", 64)


def test_make_goodput_reads_a_cached_profile(models, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path))
    policy, planner, verify = make_goodput(models, None, max_k=5)
    assert policy.max_k == 5 and verify is None and not planner.verify.points()
    path = profile_cache_path(models.target.name, models.target.runner.dtype)
    assert path.parent == tmp_path / "profiles" and path.name.endswith("-float32.json")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"verify_ms": {"128": [2.0, 2.5, 3.0]}}))
    _, planner, _ = make_goodput(models, None)
    assert planner.verify(2) == pytest.approx(0.0025)
    with pytest.raises(ConfigError, match="memory='lots' of policy 'goodput' must be a number"):
        make_policy("goodput", models, memory="lots")
    with pytest.raises(ConfigError, match="unknown option 'gamma' for policy 'goodput'"):
        make_policy("goodput", models, gamma=3)


def test_ended_requests_report_their_spells_and_drafted_steps(tmp_path):
    """Each request decodes with its own copy of the row policy, so the engine tells the
    controller when one ends: the spell it ended in and the steps it drafted on in all."""
    target = save_tiny(tmp_path / "target", seed=0)
    draft = save_tiny(tmp_path / "draft", seed=1)
    models = load_models(str(target), str(draft), "float32", "cpu", 64, batch_size=3)
    engine = build_engine(models, "model", policy="goodput")
    retired = []
    retire = engine.planner.retire

    def spy(policy):
        retired.append((policy.drafted_steps, policy.planned))
        retire(policy)

    engine.planner.retire = spy
    config = GenerationConfig(max_new_tokens=12)
    engine.generate_batch([[5, 6, 7], [8, 9], [10, 11, 12, 13]], config)
    assert len(retired) == 3 and any(n for n, _ in retired)  # the first steps probe
    assert list(engine.planner.lifetimes) == [n for n, planned in retired if planned]
    engine.generate([5, 6], config)  # one request alone: the same path
    assert len(retired) == 4
    assert list(engine.planner.lifetimes) == [n for n, planned in retired if planned]


def test_a_request_that_only_probed_is_not_a_start_a_plan_chose():
    """The steps requests drafted on price starts (`start_horizon`); a probe is a test, so a
    request that drafted only probe tokens does not count, one a plan had draft does."""
    c = controller(lambda n: 0.1, draft=lambda u: 0.01 * u)
    probed, planned = GoodputPolicy(max_k=4), GoodputPolicy(max_k=4)
    c._remember([probed, planned], [1, 0], probing=True)
    c._remember([probed, planned], [0, 1])
    c._remember([probed, planned], [0, 1])
    assert probed.drafted_steps == 1 and not probed.planned and planned.planned
    c.retire(probed)
    assert not c.lifetimes
    c.retire(planned)
    assert list(c.lifetimes) == [2]


def test_a_start_is_charged_for_the_steps_it_will_not_serve_when_finishing_a_batch():
    """Finishing a batch, a plan saves over all the steps it takes, but a start is repaid only
    over the steps its request goes on drafting: at batch 8 in bf16 the controller started all
    rows (0.83 s) for 1-13 steps of drafting and lost 3-7 % of plain decoding's time (BENCHMARKS
    §10.25). A start expected to serve fewer steps than the plan takes is charged its whole times
    the ratio; resumes, and starts before any planned request has ended, whole."""
    c = controller(lambda n: 0.24 + 0.001 * n, draft=lambda u: 0.1 * u)
    forecasts, remaining, start = [[0.75]] * 8, [48] * 8, [0.1] * 8  # ~27 steps drafting
    assert c.finish_plan(forecasts, start, remaining)[0] == [1] * 8
    assert c.finish_plan(forecasts, start, remaining, [40.0] * 8)[0] == [1] * 8
    assert c.finish_plan(forecasts, start, remaining, [10.0] * 8)[0] == [0] * 8
    assert c.finish_plan(forecasts, [0.0] * 8, remaining, [10.0] * 8)[0] == [1] * 8
    assert finishing_catch_up([0.1, 0.1], [10.0, math.inf], [1, 1], 27.0) == pytest.approx(0.37)
    assert finishing_catch_up([0.1, 0.1], None, [1, 0], 27.0) == pytest.approx(0.1)
    policies = [GoodputPolicy(max_k=1) for _ in range(8)]
    assert c._serves(policies) is None  # no planned request has ended: whole
    c.lifetimes.extend([9, 8, 13])
    policies[0].drafted_ever = True
    assert c._serves(policies) == [math.inf] + [9.0] * 7


def test_generate_with_goodput_policy(capsys, tmp_path):
    target = save_tiny(tmp_path / "target", seed=0)
    draft = save_tiny(tmp_path / "draft", seed=1)
    common = ["--target", str(target), "--dtype", "float32", "--max-new-tokens", "8"]
    for drafter in (["--draft", str(draft)], ["--drafter", "ngram"]):
        code = main(["generate", *common, *drafter, "--policy", "goodput", "--prompt", "w5 w6"])
        assert code == 0
    assert main(["generate", *common, "--policy", "goodput", "--k", "3", "--prompt", "w5"]) == 2
    assert "unknown option 'k' for drafter 'model' and policy 'goodput'" in capsys.readouterr().err


def test_a_stale_spell_of_rejections_fades_to_the_long_run_acceptance():
    """Drafting one token pays iff a_1 > 0.5 here. A recent spell of rejections (4 of 20
    accepted) against a long run of 70 % stops drafting; steps without drafting teach nothing, so
    the spell fades (IDLE_MEMORY per idle step) and drafting resumes after ~26 of them, without a
    probe. One rejection after resuming stops it again: a real spell costs a step, not a run."""
    c = controller(lambda n: 1.0, draft=lambda u: 0.5 * u)
    c.probe_share = 1e-4  # no probes in this test
    c.long_run.tested, c.long_run.accepted = [100.0], [70.0]
    c.acceptance.tested, c.acceptance.accepted = [20.0], [4.0]
    policies = [GoodputPolicy(max_k=1)]
    idle = StepRecord(0, 0, 0, 1, 0.0, 0.0, 50, 0)
    policies[0].observe(idle)  # past its request's first step
    budgets = []
    for _ in range(40):
        budgets.append(c.plan(policies, [1])[0])
        if budgets[-1]:
            break
        c.observe([0], [idle], 0.0, 1.0, 1.0)
    assert budgets[:20] == [0] * 20 and budgets[-1] == 1 and len(budgets) <= 30
    rejected = StepRecord(1, 1, 0, 1, 0.5, 1.0, 51, 1)
    c.observe([1], [rejected], 0.5, 1.0, 1.5)
    assert c.plan(policies, [1]) == [0]


def test_a_position_no_plan_reaches_is_explored_until_known():
    """Position 1 is known (70 %), position 2 never tested: its forecast is position 1's, at
    which one token is the best plan, though a second would pay if it were accepted more
    often. The row then drafts a second token until the long run has EXPLORE_SAMPLES tests of
    position 2, so a position 2 accepted more often than position 1 (as after a good first
    guess) can be found."""
    c = controller(lambda n: 1.0, draft=lambda u: 0.45 * u)
    c.long_run.tested, c.long_run.accepted = [100.0], [70.0]
    policy = GoodputPolicy(max_k=4)
    assert c.best_plan([c.long_run.estimates(4, None, 2.0)])[0] == [1]
    assert c.plan([policy], [4]) == [2]
    assert c.plan([policy], [1]) == [1]  # a row at its cap is not deepened
    c.long_run.tested, c.long_run.accepted = [100.0, EXPLORE_SAMPLES], [70.0, 4.0]
    assert c.plan([policy], [4]) == [1]


@pytest.mark.parametrize("finish", [False, True])
def test_a_position_that_cannot_pay_even_if_always_accepted_is_not_explored(finish):
    """Verification as measured on the AVX2-only CPU at batch 2 (BENCHMARKS §10.19): 4 tokens
    take 450 ms, 5 take 555. Two rows drafting one token each (position 1 accepted 70 %) beat
    plain decoding, and a second token for either row or both would not pay even if always
    accepted, so position 2 is not explored, whether plans maximise tokens per second or
    minimise the time until the batch's last row finishes."""
    c = controller(lambda n: 0.4 if n == 1 else 0.45 if n <= 4 else 0.555 + 0.11 * (n - 5),
                   draft=lambda u: 0.17 * u)  # fmt: skip
    c.long_run.tested, c.long_run.accepted = [100.0], [70.0]
    assert c.best_plan([[0.7, 1.0]] * 2)[0] == [1, 1]
    policies = [GoodputPolicy(max_k=4) for _ in range(2)]
    for policy in policies:
        policy.opening = False
        policy.acceptance.tested, policy.acceptance.accepted = [500.0], [350.0]
    remaining = [40, 40] if finish else None
    assert c.plan(policies, [4, 4], remaining) == [1, 1]


def test_a_size_timed_once_under_load_is_retimed_once_forgotten():
    """BENCHMARKS §10.19's deliberate test: at batch 2 on the AVX2-only CPU one 4-token
    verification timed while two other processes ran took 1504 ms (3 tokens: 445). Drafting in
    both rows, the one plan that pays when the batch finishes together, then looks hopeless even
    if always accepted, and probes (one token in one row, 3 fed) never re-time 4 tokens. Plain
    steps and probes age that timing out after SAMPLE_AGE steps; then the batch drafts again."""
    c = GoodputController(joint=True)
    c.verify.add(4, 1.504)
    c.draft.add([1], 0.17)
    c.other.append(0.0)
    c.long_run.tested, c.long_run.accepted = [100.0], [70.0]
    policies = [GoodputPolicy(max_k=4) for _ in range(2)]
    for policy in policies:
        policy.opening = False
        policy.acceptance.tested, policy.acceptance.accepted = [500.0], [350.0]
    for step in range(SAMPLE_AGE):
        c.verify.add(3 if step % MAX_PROBE_GAP < 2 else 2, 0.445)  # probes, plain steps
        if step == SAMPLE_AGE - 2:
            assert c.plan(policies, [4, 4], remaining=[40, 40]) == [0, 0]
    assert c.verify.measured(4) == 0
    assert c.plan(policies, [4, 4], remaining=[40, 40]) == [1, 1]


def test_first_steps_are_learned_apart_from_the_rest_of_a_request():
    """A request's first step drafts the answer's first token, which a draft model predicts
    worst: rejected first steps teach the opening estimate, not the batch-wide acceptance or
    the row's own, so the controller decodes first steps plainly and drafts from the next on."""
    c = controller(lambda n: 1.0, draft=lambda u: 0.45 * u)  # one token pays iff a_1 > 0.45
    c.long_run.tested, c.long_run.accepted = [100.0], [70.0]
    rejected = StepRecord(1, 1, 0, 1, 0.45, 1.0, 50, 1)
    for _ in range(10):  # ten requests whose first draft was rejected
        policy = GoodputPolicy(max_k=1)
        assert policy.opening
        c.plan([policy], [1])  # (whatever it plans: the record says the row drafted)
        c.observe([1], [rejected], 0.45, 1.0, 1.45)
        policy.observe(rejected)
        assert not policy.opening and policy.acceptance.tested_at(0) == 0
    assert c.opening_acceptance.tested_at(0) > 0 and c.long_run.tested_at(0) == 100.0
    policy = GoodputPolicy(max_k=1)
    assert c.plan([policy], [1]) == [0]  # the next first step is decoded plainly
    idle = StepRecord(0, 0, 0, 1, 0.0, 0.0, 50, 0)
    c.observe([0], [idle], 0.0, 1.0, 1.0)
    policy.observe(idle)
    assert c.plan([policy], [1]) == [1]  # and the step after it drafts


def test_the_target_confidence_forecasts_a_row_before_it_drafts():
    """A row's running target confidence (read from its verified steps) refines the first
    position's batch-wide acceptance, learned from drafting steps by the confidence each row had
    when they were planned: at batch 2, where drafting pays only when both rows accept well,
    two rows the target is sure of draft and a pair with one unsure row decodes plainly."""
    c = controller(lambda n: 0.2 + 0.002 * n, draft=lambda u: 0.1 * u)
    sure, unsure = GoodputPolicy(max_k=1), GoodputPolicy(max_k=1)
    for policy in (sure, unsure):
        policy.opening = False
    for confidence in (1.0, 0.98, 0.96, 0.97):
        sure.observe(StepRecord(0, 0, 0, 1, 0.0, 0.2, 9, 0, target_confidence=confidence))
    assert sure.target_confidence == pytest.approx(0.9822, abs=1e-4)  # 0.75 kept per step
    unsure.observe(StepRecord(0, 0, 0, 1, 0.0, 0.2, 9, 0, target_confidence=0.35))
    assert unsure.target_confidence == 0.35
    for _ in range(80):  # drafting steps planned at each confidence, and their outcomes
        c._remember([sure, unsure], [1, 1])
        records = [StepRecord(1, 1, a, 1 + a, 0.1, 0.2, 9, 1) for a in (1, 0)]
        c.observe([1, 1], records, 0.1, 0.2, 0.3)
    prior = [0.7]
    assert c.row_prior(prior, sure)[0] > 0.9 and c.row_prior(prior, unsure)[0] < 0.1
    assert c.row_prior(prior, GoodputPolicy()) == prior  # no confidence yet: the batch-wide
    twin = GoodputPolicy(max_k=1)
    twin.opening, twin.target_confidence = False, sure.target_confidence
    for policy in (sure, unsure, twin):
        policy.spell, policy.drafted_ever = 1, True  # caught up: no catch-up charged
    assert c.plan([sure, twin], [1, 1], remaining=[40, 40]) == [1, 1]
    assert c.plan([sure, unsure], [1, 1], remaining=[40, 40]) == [0, 0]


def test_steps_carry_the_target_confidence_where_a_planner_reads_it(tmp_path):
    target = save_tiny(tmp_path / "target", seed=0)
    draft = save_tiny(tmp_path / "draft", seed=1)
    models = load_models(str(target), str(draft), "float32", "cpu", 64, batch_size=2)
    config = GenerationConfig(max_new_tokens=6)
    for policy, planned in (("goodput", True), ("constant", False)):
        engine = build_engine(models, "model", policy=policy)
        records = engine.generate_batch([[5, 6, 7], [8, 9]], config)[0].stats.records
        read = [record.target_confidence for record in records if record.target_confidence]
        assert all(0.0 < x <= 1.0 for x in read) and bool(read) == planned


def test_the_target_confidence_is_not_read_where_drafting_cannot_pay():
    """Reading it costs a pass over the vocabulary per row; where even drafts that are always
    accepted would not pay, no forecast matters."""
    c = controller(lambda n: 0.1 * n, draft=lambda u: 0.5 * u)
    assert c.reads_target_confidence  # nothing planned yet
    for _ in range(EXPLORE_SAMPLES):
        c.long_run.add(1, 1)
    policies = [GoodputPolicy(max_k=2) for _ in range(2)]
    for policy in policies:
        policy.opening = False
    c.plan(policies, [2, 2], remaining=[40, 40])
    assert c.hopeless and not c.reads_target_confidence
    cheap = controller(lambda n: 0.1, draft=lambda u: 0.001 * u)
    cheap.plan(policies, [2, 2], remaining=[40, 40])
    assert cheap.reads_target_confidence


def test_the_target_confidence_is_not_read_where_no_confidence_could_make_a_plan_draft():
    """Between hopeless and paying (at batch 8 in bf16 reading cost ~0.7 % of each idle batch,
    BENCHMARKS §10.31): while even the best-rated confidence bin could not make a row draft,
    the next step's reading could not change the plan; once a bin rates high enough, it could.
    A row not read forgets its old confidence."""
    c = controller(lambda n: 0.2 + 0.002 * n, draft=lambda u: 0.18 * u)  # pays above a ~ 0.91
    for i in range(2 * EXPLORE_SAMPLES):  # half the first positions accepted
        c.long_run.add(1, i % 2)
        c.acceptance.add(1, i % 2)
    row = GoodputPolicy(max_k=1)
    row.opening, row.spell, row.drafted_ever = False, 1, True
    assert c.plan([row], [1]) == [0]
    assert not c.hopeless and c.moot and not c.reads_target_confidence
    for _ in range(60):  # the target's surest rows accept every time
        c.target_calibration.add(0.97, True)
    assert c.plan([row], [1]) == [0]  # this row shows no confidence yet
    assert not c.moot and c.reads_target_confidence
    row.target_confidence = 0.97
    row.observe(StepRecord(0, 0, 0, 1, 0.0, 0.2, 9, 0))
    assert row.target_confidence is None


def retire_unrepaid_probes(c: GoodputController, requests: int) -> None:
    """End `requests` requests that a probe started and no plan went on to draft."""
    for _ in range(requests):
        request = GoodputPolicy()
        request.probe_started = True
        c.retire(request)


def test_a_probes_start_is_charged_whole_where_probes_are_not_repaid():
    """A probe that starts a request pays the draft's read of its prompt; spread over the steps
    a start serves only while plans go on to draft the requests probes start. Where they do
    not (batch 8 in bf16: ~1.5 % of plain decoding's time for a 1 % probe share, BENCHMARKS
    §10.27), each start is charged whole, and probes come further apart."""
    c = controller(lambda n: 0.2 + 0.001 * n, draft=lambda u: 0.05 * u)
    c.start.append(0.5)
    probed, planned = GoodputPolicy(), GoodputPolicy()
    c._remember([probed, planned], [1, 0], probing=True)
    c._remember([probed, planned], [1, 1], probing=False)
    assert probed.probe_started and not planned.probe_started  # only a probe's start counts
    fresh = GoodputPolicy()
    fresh.opening = False
    assert c.probe_charge(fresh) == pytest.approx(0.5 / c.start_horizon())  # none ended yet
    before = c.probe_gap([1, 0], [[0.7], [0.7]], [c.probe_charge(fresh), 0.0])
    retire_unrepaid_probes(c, 9)
    assert c.probe_repaid() == pytest.approx(2 / 11)
    whole_share = 9 / 11
    charged = 0.5 * (2 / 11 / c.start_horizon() + whole_share)
    assert c.probe_charge(fresh) == pytest.approx(charged)
    assert c.probe_gap([1, 0], [[0.7], [0.7]], [charged, 0.0]) > before
    c.retire(probed)  # a request a plan went on to draft repays its probe's start
    assert c.probe_repaid() == pytest.approx(3 / 11)  # the last 9 requests count


def test_probes_grow_rarer_as_the_requests_they_start_go_undrafted():
    """A probe is worth what it can lead to: its share of throughput shrinks with the chance
    that a plan goes on to draft what probes start (`probe_repaid`), even for a probe with
    nothing to catch up (at batch 8 in bf16 no plan followed a probe, which cost ~1-2 % of
    each batch, BENCHMARKS §10.30)."""
    c = controller(lambda n: 0.2 + 0.001 * n, draft=lambda u: 0.25 * u)  # does not pay
    probe, forecasts, catch_up = [1, 0], [[0.7], [0.7]], [0.0, 0.0]
    seconds = c.other_seconds() + c.draft([1, 0]) + c.verify(3)
    loss = seconds / (c.other_seconds() + c.verify(2)) - (2 + 0.7) / 2
    assert c.probe_gap(probe, forecasts, catch_up) == pytest.approx(loss / c.probe_share)
    assert 0 < loss / c.probe_share * 4 < MAX_PROBE_GAP
    retire_unrepaid_probes(c, 6)
    share = c.probe_share * 2 / 8
    assert c.probe_gap(probe, forecasts, catch_up) == pytest.approx(loss / share)


def test_one_rejection_in_a_confidence_bin_no_step_reached_moves_its_rows_little():
    """The target-confidence calibration learns only from drafting steps, so its outer bins see
    few; a single rejection there must not set every row there far below the batch-wide
    forecast (in a finishing batch one such row keeps the whole batch from drafting)."""
    c = GoodputController(joint=True)
    row = GoodputPolicy(max_k=1)
    row.opening, row.target_confidence = False, 0.95
    c.target_calibration.add(0.95, False)
    assert c.row_prior([0.7], row)[0] > 0.6
    for _ in range(30):  # many rejections there do tell
        c.target_calibration.add(0.95, False)
    assert c.row_prior([0.7], row)[0] < 0.25
