"""The goodput controller's costs: latency curves learned from the steps' timings, T_draft."""

from __future__ import annotations

import random

import pytest

from specpilot.errors import ConfigError
from specpilot.policies.controller import (
    MAX_PROBE_GAP,
    SAMPLE_AGE,
    GoodputController,
    GoodputPolicy,
)
from specpilot.policies.latency import LatencyCurve
from specpilot.types import StepRecord


def test_joint_draft_cost_is_one_forward_per_position_over_the_rows_still_drafting():
    """T_draft of a joint drafter: Σ over positions of F(rows drafting that position), F learned
    per rows a forward serves, so one-row probes do not unlearn what eight rows cost."""
    c = GoodputController(joint=True)
    assert (
        not c.costs.draft.timed and c.costs.draft([2, 2]) == 0.0
    )  # unknown: optimistic, then timed
    for _ in range(3):
        c.costs.draft.add([1] * 8, 0.081)
        c.costs.draft.add([1] + [0] * 7, 0.063)
        c.costs.draft.add([0, 1] + [0] * 6, 0.063)
    assert c.costs.draft([1] * 8) == pytest.approx(0.081)
    assert c.costs.draft([1] + [0] * 7) == pytest.approx(0.063)
    assert c.costs.draft([2] * 8) == pytest.approx(2 * 0.081)
    assert c.costs.draft([2, 1, 0, 0]) == pytest.approx(c.costs.draft.forwards(2)[2] + 0.063)
    # beyond the rows timed, the slope over them (the 0.5B's sixteen rows: 104 ms measured)
    assert c.costs.draft([1] * 16) == pytest.approx(0.081 + 8 * 0.018 / 7)
    c.costs.draft.add(
        [3, 3, 0], 3 * 0.065
    )  # a step: its mean rows per forward, its time per forward
    assert c.costs.draft.curve.measured(2) == 1
    last = [0, 0, 0, 0]
    tally = c.costs.draft.tally(4)  # the plan searches' running total, a position at a time
    for budgets in ([1, 0, 0, 0], [1, 1, 0, 0], [2, 1, 0, 0], [2, 1, 1, 0], [2, 2, 1, 0]):
        q = next(q for q, (b, a) in enumerate(zip(budgets, last, strict=True)) if b > a)
        assert tally.grow(budgets[q]) == pytest.approx(c.costs.draft(budgets))
        last = budgets


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


def test_observe_learns_verify_draft_and_tree_width():
    c = GoodputController(joint=False)
    c.plan([GoodputPolicy(), GoodputPolicy()], [3, 0])  # the step observed below
    records = [StepRecord(3, 3, 1, 2, 0.0, 0.0, 9, 6), StepRecord(0, 0, 0, 1, 0.0, 0.0, 9, 0)]
    c.observe([3, 0], records, draft_s=0.3, verify_s=0.5, step_s=1.0)
    assert c.costs.verify.measured(2 + 6) == 1 and c.costs.draft([3]) == pytest.approx(0.3)
    assert c.costs.other[0] == pytest.approx(0.2)
    assert c.costs.fed_per_depth == pytest.approx(
        0.9 + 0.1 * 2
    )  # 6 tree nodes for 3 drafted levels
    assert c.costs.nodes(3) == 6 and c.costs.nodes(2) == pytest.approx(2 * c.costs.fed_per_depth)


def test_a_size_timed_once_under_load_is_retimed_once_forgotten():
    """BENCHMARKS §10.19's deliberate test: at batch 2 on the AVX2-only CPU one 4-token
    verification timed while two other processes ran took 1504 ms (3 tokens: 445). Drafting in
    both rows, the one plan that pays when the batch finishes together, then looks hopeless even
    if always accepted, and probes (one token in one row, 3 fed) never re-time 4 tokens. Plain
    steps and probes age that timing out after SAMPLE_AGE steps; then the batch drafts again."""
    c = GoodputController(joint=True)
    c.costs.verify.add(4, 1.504)
    c.costs.draft.add([1], 0.17)
    c.costs.other.append(0.0)
    c.batch.long_run.tested, c.batch.long_run.accepted = [100.0], [70.0]
    policies = [GoodputPolicy(max_k=4) for _ in range(2)]
    for policy in policies:
        policy.opening = False
        policy.acceptance.tested, policy.acceptance.accepted = [500.0], [350.0]
    for step in range(SAMPLE_AGE):
        c.costs.verify.add(3 if step % MAX_PROBE_GAP < 2 else 2, 0.445)  # probes, plain steps
        if step == SAMPLE_AGE - 2:
            assert c.plan(policies, [4, 4], remaining=[40, 40]) == [0, 0]
    assert c.costs.verify.measured(4) == 0
    assert c.plan(policies, [4, 4], remaining=[40, 40]) == [1, 1]
