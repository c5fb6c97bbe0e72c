"""The goodput controller's acceptance forecasts: by position, by confidence, per row."""

from __future__ import annotations

import pytest
import torch
from controller_timing import controller

from specpilot.errors import ConfigError
from specpilot.policies.controller import (
    EXPLORE_SAMPLES,
    PRIOR_ACCEPTANCE,
    AcceptanceByPosition,
    ConfidenceCalibration,
    GoodputController,
    GoodputPolicy,
)
from specpilot.types import StepRecord


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


def test_a_stale_spell_of_rejections_fades_to_the_long_run_acceptance():
    """Drafting one token pays iff a_1 > 0.5 here. A recent spell of rejections (4 of 20
    accepted) against a long run of 70 % stops drafting; steps without drafting teach nothing, so
    the spell fades (IDLE_MEMORY per idle step) and drafting resumes after ~26 of them, without a
    probe. One rejection after resuming stops it again: a real spell costs a step, not a run."""
    c = controller(lambda n: 1.0, draft=lambda u: 0.5 * u)
    c.exploration.probe_share = 1e-4  # no probes in this test
    c.batch.long_run.tested, c.batch.long_run.accepted = [100.0], [70.0]
    c.batch.recent.tested, c.batch.recent.accepted = [20.0], [4.0]
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


def test_first_steps_are_learned_apart_from_the_rest_of_a_request():
    """A request's first step drafts the answer's first token, which a draft model predicts
    worst: rejected first steps teach the opening estimate, not the batch-wide acceptance or
    the row's own, so the controller decodes first steps plainly and drafts from the next on."""
    c = controller(lambda n: 1.0, draft=lambda u: 0.45 * u)  # one token pays iff a_1 > 0.45
    c.batch.long_run.tested, c.batch.long_run.accepted = [100.0], [70.0]
    rejected = StepRecord(1, 1, 0, 1, 0.45, 1.0, 50, 1)
    for _ in range(10):  # ten requests whose first draft was rejected
        policy = GoodputPolicy(max_k=1)
        assert policy.opening
        c.plan([policy], [1])  # (whatever it plans: the record says the row drafted)
        c.observe([1], [rejected], 0.45, 1.0, 1.45)
        policy.observe(rejected)
        assert not policy.opening and policy.acceptance.tested_at(0) == 0
    assert c.batch.opening.tested_at(0) > 0 and c.batch.long_run.tested_at(0) == 100.0
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
        c.note_plan([sure, unsure], [1, 1])
        records = [StepRecord(1, 1, a, 1 + a, 0.1, 0.2, 9, 1) for a in (1, 0)]
        c.observe([1, 1], records, 0.1, 0.2, 0.3)
    prior = [0.7]
    assert c.batch.row_prior(prior, sure)[0] > 0.9 and c.batch.row_prior(prior, unsure)[0] < 0.1
    assert c.batch.row_prior(prior, GoodputPolicy()) == prior  # no confidence yet: the batch-wide
    twin = GoodputPolicy(max_k=1)
    twin.opening, twin.target_confidence = False, sure.target_confidence
    for policy in (sure, unsure, twin):
        policy.spell, policy.drafted_ever = 1, True  # caught up: no catch-up charged
    assert c.plan([sure, twin], [1, 1], remaining=[40, 40]) == [1, 1]
    assert c.plan([sure, unsure], [1, 1], remaining=[40, 40]) == [0, 0]


def test_the_target_confidence_is_not_read_where_drafting_cannot_pay():
    """Reading it costs a pass over the vocabulary per row; where even drafts that are always
    accepted would not pay, no forecast matters."""
    c = controller(lambda n: 0.1 * n, draft=lambda u: 0.5 * u)
    assert c.reads_target_confidence  # nothing planned yet
    for _ in range(EXPLORE_SAMPLES):
        c.batch.long_run.add(1, 1)
    policies = [GoodputPolicy(max_k=2) for _ in range(2)]
    for policy in policies:
        policy.opening = False
    c.plan(policies, [2, 2], remaining=[40, 40])
    assert c.exploration.hopeless and not c.reads_target_confidence
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
        c.batch.long_run.add(1, i % 2)
        c.batch.recent.add(1, i % 2)
    row = GoodputPolicy(max_k=1)
    row.opening, row.spell, row.drafted_ever = False, 1, True
    assert c.plan([row], [1]) == [0]
    assert not c.exploration.hopeless and c.moot and not c.reads_target_confidence
    for _ in range(60):  # the target's surest rows accept every time
        c.batch.target_calibration.add(0.97, True)
    assert c.plan([row], [1]) == [0]  # this row shows no confidence yet
    assert not c.moot and c.reads_target_confidence
    row.target_confidence = 0.97
    row.observe(StepRecord(0, 0, 0, 1, 0.0, 0.2, 9, 0))
    assert row.target_confidence is None


def test_one_rejection_in_a_confidence_bin_no_step_reached_moves_its_rows_little():
    """The target-confidence calibration learns only from drafting steps, so its outer bins see
    few; a single rejection there must not set every row there far below the batch-wide
    forecast (in a finishing batch one such row keeps the whole batch from drafting)."""
    c = GoodputController(joint=True)
    row = GoodputPolicy(max_k=1)
    row.opening, row.target_confidence = False, 0.95
    c.batch.target_calibration.add(0.95, False)
    assert c.batch.row_prior([0.7], row)[0] > 0.6
    for _ in range(30):  # many rejections there do tell
        c.batch.target_calibration.add(0.95, False)
    assert c.batch.row_prior([0.7], row)[0] < 0.25
