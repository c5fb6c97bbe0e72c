"""The goodput controller's exploration: probes and deepening."""

from __future__ import annotations

import pytest
from controller_timing import controller

from specpilot.errors import ConfigError
from specpilot.policies.controller import (
    EXPLORE_SAMPLES,
    MAX_PROBE_GAP,
    GoodputController,
    GoodputPolicy,
    best_plan,
)
from specpilot.types import StepRecord


def test_first_step_is_plain_and_idle_steps_lead_to_a_probe():
    c = GoodputController(joint=True)
    policies = [GoodputPolicy(max_k=4) for _ in range(2)]
    assert c.plan(policies, [4, 4]) == [0, 0]  # nothing measured: the plain step first
    c.observe([0, 0], [StepRecord(0, 0, 0, 1, 0.0, 0.0, 5, 0)] * 2, 0.0, 1.0, 1.0)
    c.costs.draft.add([1], 0.5)  # drafting does not pay (it would if every draft were accepted)
    c.batch.long_run.tested = [EXPLORE_SAMPLES]  # and the acceptance is known
    c.batch.long_run.accepted = [EXPLORE_SAMPLES / 2]
    c.exploration.probe_share = 0.2
    # a probe: 2.5 expected tokens in 0.5 + 1 s against 2 in 1 s loses 1.5 − 1.25 = 0.25 plain
    # steps, which at probe_share 0.2 makes every second step without drafting a probe
    plans = [c.plan(policies, [4, 4]) for _ in range(4)]
    assert plans == [[0, 0], [1, 0], [0, 0], [1, 0]]
    assert c.plan(policies, [0, 0]) == [0, 0]


def test_probes_are_frequent_where_drafting_nearly_pays():
    c = GoodputController(joint=True)
    c.costs.verify.add(1, 1.0)
    c.costs.verify.add(2, 1.0)
    probe, catch_up = [1], [0.0]
    c.costs.draft.add([1], 0.6)  # 1.5 tokens in 1.6 s: loses 0.1 of a plain step
    assert c.exploration.gap(c.costs, probe, [[0.5]], catch_up) == pytest.approx((1.6 - 1.5) / 0.01)
    c.costs.draft.add([1], 2.0)
    c.costs.draft.add([1], 2.0)  # far off: 1.5 tokens in 3 s, 1.5 plain steps lost, rare
    assert c.exploration.gap(c.costs, probe, [[0.5]], catch_up) == pytest.approx((3.0 - 1.5) / 0.01)
    c.exploration.probe_share = 0.001
    assert c.exploration.gap(c.costs, probe, [[0.5]], catch_up) == MAX_PROBE_GAP
    assert c.exploration.gap(c.costs, [0], [[]], catch_up) == float("inf")
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
    assert steep.batch.long_run.tested_at(0) < EXPLORE_SAMPLES
    assert sum(steep.plan(policies, [4] * 4)) == 1  # T_verify(5) was timed once: re-timed
    steep.costs.verify.add(5, 0.5)
    assert all(steep.plan(policies, [4] * 4) == [0] * 4 for _ in range(20))
    steep.exploration.idle = MAX_PROBE_GAP - 1
    assert sum(steep.plan(policies, [4] * 4)) == 1
    flat = controller(lambda n: 0.1 + 0.02 * n, draft=lambda u: 0.08 * u)
    flat.batch.recent.add(1, 0)  # one rejection: drafting looks poor, but is still unknown
    assert best_plan(flat.costs, [f[:4] for f in [[0.1] * 4] * 4])[0] == [0] * 4
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
    c.batch.long_run.tested, c.batch.long_run.accepted = [100.0], [47.0]
    c.catch_up.start.append(0.817)
    policies = [GoodputPolicy(max_k=4) for _ in range(2)]
    for policy in policies:
        policy.opening = False
    plans = [c.plan(policies[:1], [4]) for _ in range(8)]
    assert plans[0] == [0] and [1] in plans
    fresh = [GoodputPolicy(max_k=4) for _ in range(2)]  # both rows would read their prompt
    for policy in fresh:
        policy.opening = False
    c.exploration.idle = 0
    plans = [c.plan(fresh, [4, 4], remaining=[40, 40]) for _ in range(40)]  # whole: 181 steps
    assert plans[0] == [0, 0] and any(sum(plan) == 1 for plan in plans)


def test_a_probe_drafts_one_row_and_prefers_one_caught_up():
    """In a batch, a probe pays one row's catch-up, not every row's."""
    c = GoodputController(joint=True)
    c.costs.verify.add(3, 1.0)
    policies = [GoodputPolicy(max_k=4) for _ in range(3)]
    assert c.plan(policies, [4, 4, 4]) == [1, 0, 0]  # T_draft unknown: probe
    assert c.plan(policies, [4, 4, 4]) == [1, 0, 0]  # the same row, now caught up
    assert c.plan(policies, [4, 0, 4]) == [1, 0, 0]
    policies[0].spell = 0  # row 0 did not draft on its last step, row 2 did
    policies[2].spell = 1
    assert c.plan(policies, [4, 4, 4]) == [0, 0, 1]
    policies[2].spell = 0  # no row is caught up: one that resumes, not one starting
    assert c.plan(policies, [4, 4, 4]) == [1, 0, 0]


def test_a_position_no_plan_reaches_is_explored_until_known():
    """Position 1 is known (70 %), position 2 never tested: its forecast is position 1's, at
    which one token is the best plan, though a second would pay if it were accepted more
    often. The row then drafts a second token until the long run has EXPLORE_SAMPLES tests of
    position 2, so a position 2 accepted more often than position 1 (as after a good first
    guess) can be found."""
    c = controller(lambda n: 1.0, draft=lambda u: 0.45 * u)
    c.batch.long_run.tested, c.batch.long_run.accepted = [100.0], [70.0]
    policy = GoodputPolicy(max_k=4)
    assert best_plan(c.costs, [c.batch.long_run.estimates(4, None, 2.0)])[0] == [1]
    assert c.plan([policy], [4]) == [2]
    assert c.plan([policy], [1]) == [1]  # a row at its cap is not deepened
    c.batch.long_run.tested, c.batch.long_run.accepted = [100.0, EXPLORE_SAMPLES], [70.0, 4.0]
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
    c.batch.long_run.tested, c.batch.long_run.accepted = [100.0], [70.0]
    assert best_plan(c.costs, [[0.7, 1.0]] * 2)[0] == [1, 1]
    policies = [GoodputPolicy(max_k=4) for _ in range(2)]
    for policy in policies:
        policy.opening = False
        policy.acceptance.tested, policy.acceptance.accepted = [500.0], [350.0]
    remaining = [40, 40] if finish else None
    assert c.plan(policies, [4, 4], remaining) == [1, 1]


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
    c.catch_up.start.append(0.5)
    probed, planned = GoodputPolicy(), GoodputPolicy()
    c.note_plan([probed, planned], [1, 0], probing=True)
    c.note_plan([probed, planned], [1, 1], probing=False)
    assert probed.probe_started and not planned.probe_started  # only a probe's start counts
    fresh = GoodputPolicy()
    fresh.opening = False
    assert c.exploration.charge(fresh, c.catch_up) == pytest.approx(
        0.5 / c.catch_up.start_horizon()
    )  # none ended yet
    before = c.exploration.gap(
        c.costs, [1, 0], [[0.7], [0.7]], [c.exploration.charge(fresh, c.catch_up), 0.0]
    )
    retire_unrepaid_probes(c, 9)
    assert c.exploration.repaid() == pytest.approx(2 / 11)
    whole_share = 9 / 11
    charged = 0.5 * (2 / 11 / c.catch_up.start_horizon() + whole_share)
    assert c.exploration.charge(fresh, c.catch_up) == pytest.approx(charged)
    assert c.exploration.gap(c.costs, [1, 0], [[0.7], [0.7]], [charged, 0.0]) > before
    c.retire(probed)  # a request a plan went on to draft repays its probe's start
    assert c.exploration.repaid() == pytest.approx(3 / 11)  # the last 9 requests count


def test_probes_grow_rarer_as_the_requests_they_start_go_undrafted():
    """A probe is worth what it can lead to: its share of throughput shrinks with the chance
    that a plan goes on to draft what probes start (`probe_repaid`), even for a probe with
    nothing to catch up (at batch 8 in bf16 no plan followed a probe, which cost ~1-2 % of
    each batch, BENCHMARKS §10.30)."""
    c = controller(lambda n: 0.2 + 0.001 * n, draft=lambda u: 0.25 * u)  # does not pay
    probe, forecasts, catch_up = [1, 0], [[0.7], [0.7]], [0.0, 0.0]
    seconds = c.costs.other_seconds() + c.costs.draft([1, 0]) + c.costs.verify(3)
    loss = seconds / (c.costs.other_seconds() + c.costs.verify(2)) - (2 + 0.7) / 2
    assert c.exploration.gap(c.costs, probe, forecasts, catch_up) == pytest.approx(
        loss / c.exploration.probe_share
    )
    assert 0 < loss / c.exploration.probe_share * 4 < MAX_PROBE_GAP
    retire_unrepaid_probes(c, 6)
    share = c.exploration.probe_share * 2 / 8
    assert c.exploration.gap(c.costs, probe, forecasts, catch_up) == pytest.approx(loss / share)
