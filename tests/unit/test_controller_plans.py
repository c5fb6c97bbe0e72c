"""The goodput controller's plan searches: tokens per second, and finishing a batch soonest."""

from __future__ import annotations

import random

import pytest
from controller_timing import controller, goodput

from specpilot.policies.controller import (
    GoodputPolicy,
    best_plan,
    finish_plan,
    finishing_quantile,
    finishing_steps,
)
from specpilot.policies.sv_length import allocate_batch, marginal_order


def test_picks_zero_when_verification_is_dear_and_acceptance_low():
    c = controller(lambda n: 0.01 * n, draft=lambda u: 0.002 * u)
    assert best_plan(c.costs, [[0.3] * 6, [0.2] * 6])[0] == [0, 0]


def test_picks_long_drafts_when_verification_is_flat_and_acceptance_high():
    c = controller(lambda n: 0.01 + 1e-5 * n, draft=lambda u: 0.0005 * u)
    assert best_plan(c.costs, [[0.95] * 8])[0] == [8]
    assert best_plan(c.costs, [[0.95] * 8, [0.9] * 8])[0] == [8, 8]


def test_respects_each_rows_cap():
    """A row's forecast is as long as it may draft (its room), and a cap of 0 drafts nothing."""
    c = controller(lambda n: 0.01 + 1e-5 * n)
    assert best_plan(c.costs, [[0.9] * 2, [0.9] * 5, []])[0] == [2, 5, 0]
    policies = [GoodputPolicy(max_k=6) for _ in range(3)]
    assert c.plan(policies, [1, 0, 6]) == [1, 0, 6]


def test_weak_rows_wait_while_strong_rows_draft():
    """With verification charged per token, only the rows whose drafts are likely accepted
    draft, and the strong row drafts further than the middling one."""
    c = controller(lambda n: 0.01 + 0.002 * n)
    plan = best_plan(c.costs, [[0.1] * 6, [0.95] * 6, [0.7] * 6])[0]
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
        plan = best_plan(c.costs, forecasts)[0]
        best = max(
            goodput(c, forecasts, [a, b, d])
            for a in range(len(forecasts[0]) + 1)
            for b in range(len(forecasts[1]) + 1)
            for d in range(len(forecasts[2]) + 1)
        )
        assert goodput(c, forecasts, plan) == pytest.approx(best, rel=1e-9), (trial, plan)


def test_joint_drafting_cost_follows_the_deepest_budget():
    """A joint drafter pays per draft forward, whatever the number of rows drafting: a draft
    step costing half a target step pays for a batch drafting together, not when each row's
    tokens cost a forward of their own."""
    verify = lambda n: 0.01 + 1e-5 * n  # noqa: E731
    draft = lambda u: 0.005 * u  # noqa: E731
    assert 0 not in best_plan(controller(verify, draft, joint=True).costs, [[0.8] * 4] * 8)[0]
    assert best_plan(controller(verify, draft, joint=False).costs, [[0.8] * 4] * 8)[0] == [0] * 8


def test_marginal_order_keeps_sv_allocation():
    """allocate_batch (SV) walks marginal_order and still stops at the first non-improving step."""
    p = [[0.9, 0.8, 0.1], [0.5, 0.4]]
    order = [(q, round(g, 6)) for q, g, _ in marginal_order(p)]
    assert order == [(0, 0.9), (0, 0.72), (1, 0.5), (1, 0.2), (0, 0.072)]
    assert allocate_batch(p, lambda n: 1.0 + 0.1 * n) == [2, 1]


def test_stop_gain_is_what_a_position_costs_at_the_planned_goodput():
    flat = controller(lambda n: 0.01, draft=lambda u: 0.0)
    assert best_plan(flat.costs, [[0.9] * 4])[1] == 0.0
    steep = controller(lambda n: 0.01 + 0.001 * n)
    budgets, stop_gain = best_plan(steep.costs, [[0.9] * 4])
    assert stop_gain == pytest.approx(goodput(steep, [[0.9] * 4], budgets) * 0.001)


def test_finishing_a_batch_follows_the_row_that_needs_most_steps():
    """When the caller waits for the last row, a row that is ahead gains nothing by drafting:
    only the rows that would finish last draft."""
    c = controller(lambda n: 0.1 + 0.002 * n, draft=lambda u: 0.01 * u)
    forecasts = [[0.8] * 4, [0.8] * 4, [0.8] * 4]
    budgets, stop_gain = finish_plan(c.costs, forecasts, [0.0] * 3, remaining=[40, 5, 40])
    assert budgets[1] == 0 and budgets[0] > 0 and budgets[2] > 0 and stop_gain > 0
    assert best_plan(c.costs, forecasts)[0][1] > 0  # tokens per second would draft it too


def test_finishing_a_batch_waits_for_its_worst_row_and_pays_catch_up_once():
    """A batch drafts only if its slowest row gains enough to pay every drafting row's cost,
    and a catch-up is charged whole: worth it over many steps, not over a few."""
    c = controller(lambda n: 0.1 + 0.01 * n, draft=lambda u: 0.02 * u)
    good, poor = [0.8] * 4, [0.15] * 4
    assert any(finish_plan(c.costs, [good, good], [0.0, 0.0], [40, 40])[0])
    assert finish_plan(c.costs, [good, poor], [0.0, 0.0], [40, 40])[0] == [0, 0]
    assert any(best_plan(c.costs, [good, poor])[0])  # per second the good row alone pays
    assert any(finish_plan(c.costs, [good, good], [0.5, 0.5], [40, 40])[0])
    assert finish_plan(c.costs, [good, good], [0.5, 0.5], [4, 4])[0] == [0, 0]


def test_finishing_a_batch_plans_for_its_slowest_row_not_its_average_one():
    """At batch 8 drafting one token that pays 9 % per step at the rows' mean acceptance (0.72)
    loses once the batch waits for its slowest row (BENCHMARKS §10.8: 31 and 32 steps for 48
    tokens where rows took 28 on average): with no steps of their own the rows' forecasts count
    as uncertain, and the batch decodes plainly; rows known from many steps draft again, but
    their outcomes still vary, so a smaller margin no longer pays (§10.27)."""
    c = controller(lambda n: 0.221 + 0.0015 * n, draft=lambda u: 0.12 * u)
    forecasts, remaining = [[0.72]] * 8, [48] * 8
    assert finish_plan(c.costs, forecasts, [0.0] * 8, remaining, tested=[[0.0]] * 8)[0] == [0] * 8
    assert finish_plan(c.costs, forecasts, [0.0] * 8, remaining, tested=[[500.0]] * 8)[0] == [1] * 8
    z = finishing_quantile(8)
    assert finishing_steps([0.72], [0.0], 48, z)[1] == pytest.approx(31.3, abs=0.05)
    known = finishing_steps([0.72], [500.0], 48, z)[1]
    assert 27.9 < known < 30  # the mean 48 / 1.72 = 27.9, plus the outcomes' spread
    assert finishing_steps([0.72], [0.0], 48, finishing_quantile(1)) == [48.0, 48 / 1.72]
    dearer = controller(lambda n: 0.221 + 0.0015 * n, draft=lambda u: 0.14 * u)
    assert (
        finish_plan(dearer.costs, forecasts, [0.0] * 8, remaining, tested=[[500.0]] * 8)[0]
        == [0] * 8
    )
    assert finish_plan(dearer.costs, forecasts, [0.0] * 8, remaining)[0] == [0] * 8  # exact: still


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


def test_a_tree_of_fixed_size_drafts_as_deep_as_it_may():
    """A tree verifies 8 nodes at depth 1 and 16 at any depth beyond: past depth 2 going deeper
    costs no verification, so the plan uses the whole cap."""
    c = controller(lambda n: 0.01 + 2e-4 * n, draft=lambda u: 1e-4 * u, joint=False)
    c.costs.nodes_by_budget = {1: 8.0, **{k: 16.0 for k in range(2, 9)}}
    assert best_plan(c.costs, [[0.7] * 6])[0] == [6]
    c.costs.nodes_by_budget = {k: 8.0 * k for k in range(1, 9)}  # a tree growing 8 nodes per level
    assert best_plan(c.costs, [[0.7] * 6])[0] < [6]
