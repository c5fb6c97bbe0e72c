"""The goodput controller's catch-up pricing: starts and resumes, and what they serve."""

from __future__ import annotations

import math

import pytest
from controller_timing import controller

from specpilot.policies.controller import (
    EXPLORE_SAMPLES,
    MAX_PROBE_GAP,
    RESUME_HORIZON,
    GoodputController,
    GoodputPolicy,
    best_plan,
    finish_plan,
    finishing_catch_up,
)
from specpilot.types import StepRecord


def test_steps_that_catch_the_drafter_up_teach_the_catch_up_cost_not_draft_time():
    """A row drafting first feeds its draft model what it missed (the prompt on its first
    drafting step, the tokens accepted meanwhile when it resumes): timing that as drafting would
    make the probes after an idle spell look expensive, and the controller would never draft
    again. It is the start or resume cost instead, learned per row."""
    c = GoodputController(joint=True)
    c.costs.verify.add(1, 1.0)
    policies = [GoodputPolicy(max_k=4)]
    record = StepRecord(1, 1, 1, 2, 0.0, 0.0, 9, 1)
    first = c.plan(policies, [4])
    assert first == [1] and c.catch_up.starting == 1  # T_draft unknown: a one-token probe
    c.observe(first, [record], draft_s=5.0, verify_s=1.0, step_s=6.0)  # the prompt's catch-up
    assert (
        c.costs.draft.curve.measured(1) == 0
        and list(c.catch_up.start) == [5.0]
        and not c.catch_up.resume
    )
    second = c.plan(policies, [4])
    assert (
        second == [1] and c.catch_up.starting == c.catch_up.resuming == 0
    )  # the caught-up row probes again
    c.observe(second, [record], draft_s=0.2, verify_s=1.0, step_s=1.2)
    assert c.costs.draft([1]) == pytest.approx(0.2)
    c.costs.draft.add([1], 10.0)
    c.costs.draft.add(
        [1], 10.0
    )  # drafting now looks hopeless: the row stops, then resumes with a probe
    c.batch.long_run.tested, c.batch.long_run.accepted = [EXPLORE_SAMPLES], [EXPLORE_SAMPLES / 2]
    assert c.plan(policies, [4]) == [0] and not policies[0].drafted_last
    c.exploration.idle = MAX_PROBE_GAP  # after a long idle spell, the next idle step probes
    assert c.plan(policies, [4]) == [1] and c.catch_up.resuming == 1
    c.observe([1], [record], draft_s=10.0 + 3.0, verify_s=1.0, step_s=14.0)
    assert list(c.catch_up.resume) == [3.0]  # the catch-up beyond T_draft(1)
    assert c.catch_up.expected(GoodputPolicy()) == 5.0 and c.catch_up.expected(policies[0]) == 0.0


def test_resuming_rows_pay_their_catch_up_in_the_plan():
    """Warm rows draft where drafting pays; cold rows wait while one step's share of their
    catch-up costs more than drafting brings, and resume when it is cheap."""
    c = controller(lambda n: 0.1 + 0.002 * n, draft=lambda u: 0.01 * u)
    forecasts = [[0.8] * 4, [0.8] * 4]
    warm = best_plan(c.costs, forecasts, [0.0, 0.0])[0]
    assert all(k > 0 for k in warm)
    dear = 1.0  # seconds charged per step for each row catching up
    assert best_plan(c.costs, forecasts, [dear, dear])[0] == [0, 0]
    assert best_plan(c.costs, forecasts, [0.0, dear])[0] == [warm[0], 0]
    cheap = 1e-4
    assert best_plan(c.costs, forecasts, [cheap, cheap])[0] == warm


def test_a_catch_up_is_spread_over_the_spells_rows_keep():
    """Rows that stop drafting after a step or two pay a catch-up whole: a plan is charged a
    catch-up over the median spell rows ended lately (RESUME_HORIZON before any, and at most),
    counting spells that ended with their request."""
    c = controller(lambda n: 0.1 + 0.002 * n, draft=lambda u: 0.01 * u)
    forecasts = [[0.8] * 4, [0.8] * 4]
    c.catch_up.start.append(0.4)  # seconds per row: worth it over 16 steps, not over one
    policies = [GoodputPolicy(max_k=4) for _ in range(2)]
    charges = [c.catch_up.charge(policy, whole=False) for policy in policies]
    assert c.catch_up.horizon() == RESUME_HORIZON and charges == [0.4 / RESUME_HORIZON] * 2
    assert all(best_plan(c.costs, forecasts, charges)[0])
    assert [c.catch_up.charge(policy, whole=True) for policy in policies] == [0.4, 0.4]
    c.note_plan(policies, [1, 1])
    c.note_plan(policies, [0, 1])  # row 0 ends a one-step spell
    assert list(c.catch_up.spells) == [1] and c.catch_up.horizon() == 1.0
    fresh = [GoodputPolicy(max_k=4) for _ in range(2)]
    assert best_plan(
        c.costs, forecasts, [c.catch_up.charge(policy, whole=False) for policy in fresh]
    )[0] == [0, 0]
    c.retire(policies[1])  # row 1's request ends two steps into its spell
    policies[1].reset()
    assert list(c.catch_up.spells) == [1, 2] and c.catch_up.horizon() == 1.5
    for _ in range(40):
        c.note_plan(policies, [1, 1])
    for policy in policies:
        c.retire(policy)
    assert c.catch_up.horizon() == RESUME_HORIZON  # median of 1, 2, 40, 40, capped


def test_a_start_is_spread_over_the_steps_its_request_drafts_in_all():
    """A start reads the prompt into the draft model once and serves every later spell, which
    resumes for a few tokens: it is charged over the steps requests drafted on in all, not over
    one spell. The server at concurrency 1 on the AVX2-only CPU (BENCHMARKS §10.20): a first
    request at break-even drafted 37 of its steps in spells of 3-4, and the next requests' starts
    (817 ms) were charged a third of their cost per step; a resume stays priced per spell."""
    c = controller(lambda n: 0.497 + 0.06 * (n - 1), draft=lambda u: 0.2 * u)
    c.catch_up.start.append(0.817)
    c.catch_up.resume.append(0.3)
    first, second = GoodputPolicy(max_k=4), GoodputPolicy(max_k=4)
    assert (
        c.catch_up.start_horizon() == c.catch_up.horizon() == RESUME_HORIZON
    )  # no request has ended yet
    for spell in [4, 3, 12, 3, 4, 3, 2, 3, 3]:  # 37 drafted steps in spells of 3 or so
        for budget in [1] * spell + [0]:
            c.note_plan([first], [budget])
    assert c.catch_up.horizon() == 3.0 and first.drafted_steps == 37
    assert c.catch_up.charge(second, whole=False) == pytest.approx(
        0.817 / 3.0
    )  # before: one spell's
    c.retire(first)  # its request ends
    assert list(c.catch_up.lifetimes) == [37] and c.catch_up.start_horizon() == 37.0
    assert c.catch_up.charge(second, whole=False) == pytest.approx(0.817 / 37.0)
    assert c.catch_up.charge(second, whole=True) == pytest.approx(0.817)
    second.drafted_ever = True  # it has read its prompt: resumes are charged per spell
    assert c.catch_up.charge(second, whole=False) == pytest.approx(0.3 / 3.0)
    forecast = [[0.7, 0.7]]  # drafting pays with a start charged over 37 steps, not over 3
    assert best_plan(c.costs, forecast, [0.817 / 37.0])[0] == [1]
    assert best_plan(c.costs, forecast, [0.817 / 3.0])[0] == [0]


def test_a_request_that_only_probed_is_not_a_start_a_plan_chose():
    """The steps requests drafted on price starts (`start_horizon`); a probe is a test, so a
    request that drafted only probe tokens does not count, one a plan had draft does."""
    c = controller(lambda n: 0.1, draft=lambda u: 0.01 * u)
    probed, planned = GoodputPolicy(max_k=4), GoodputPolicy(max_k=4)
    c.note_plan([probed, planned], [1, 0], probing=True)
    c.note_plan([probed, planned], [0, 1])
    c.note_plan([probed, planned], [0, 1])
    assert probed.drafted_steps == 1 and not probed.planned and planned.planned
    c.retire(probed)
    assert not c.catch_up.lifetimes
    c.retire(planned)
    assert list(c.catch_up.lifetimes) == [2]


def test_a_start_is_charged_for_the_steps_it_will_not_serve_when_finishing_a_batch():
    """Finishing a batch, a plan saves over all the steps it takes, but a start is repaid only
    over the steps its request goes on drafting: at batch 8 in bf16 the controller started all
    rows (0.83 s) for 1-13 steps of drafting and lost 3-7 % of plain decoding's time (BENCHMARKS
    §10.25). A start expected to serve fewer steps than the plan takes is charged its whole times
    the ratio; resumes, and starts before any planned request has ended, whole."""
    c = controller(lambda n: 0.24 + 0.001 * n, draft=lambda u: 0.1 * u)
    forecasts, remaining, start = [[0.75]] * 8, [48] * 8, [0.1] * 8  # ~27 steps drafting
    assert finish_plan(c.costs, forecasts, start, remaining)[0] == [1] * 8
    assert finish_plan(c.costs, forecasts, start, remaining, [40.0] * 8)[0] == [1] * 8
    assert finish_plan(c.costs, forecasts, start, remaining, [10.0] * 8)[0] == [0] * 8
    assert finish_plan(c.costs, forecasts, [0.0] * 8, remaining, [10.0] * 8)[0] == [1] * 8
    assert finishing_catch_up([0.1, 0.1], [10.0, math.inf], [1, 1], 27.0) == pytest.approx(0.37)
    assert finishing_catch_up([0.1, 0.1], None, [1, 0], 27.0) == pytest.approx(0.1)
    policies = [GoodputPolicy(max_k=1) for _ in range(8)]
    assert c.catch_up.serves(policies) is None  # no planned request has ended: whole
    c.catch_up.lifetimes.extend([9, 8, 13])
    policies[0].drafted_ever = True
    assert c.catch_up.serves(policies) == [math.inf] + [9.0] * 7
