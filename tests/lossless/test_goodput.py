"""The goodput controller keeps decoding lossless (docs/methods.md §6, kinds 3-4; §7).

Every drafter takes per-row budgets of 0 (that row takes a plain step in the same target
forward) beside rows that draft, and a step where no row drafts never calls the drafter; the
greedy output stays plain greedy decoding, single and batched, with a scripted planner and with
the controller itself (fed synthetic timings, so its plans are reproducible and mix 0 and
drafting); sampled output follows the target's distribution, for a lone row and a batched one;
with SV after it, the companion does not run on steps that draft nothing.
"""

from __future__ import annotations

import pytest
import torch
from eagle_fixtures import tiny_head
from test_engine_sampling import SAMPLINGS, VOCAB, chi_square_pvalue, exact_joint_distribution
from test_sv import table_from_a
from tiny import TinyTokenizer, perturbed, tiny_model

from specpilot.config import GenerationConfig
from specpilot.drafting import ModelDrafter, NgramDrafter
from specpilot.drafting.dvi_head import DraftHead
from specpilot.drafting.eagle import EagleDrafter
from specpilot.drafting.layer_split import LayerSplitDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.engine.scheduler import Scheduler
from specpilot.models.decoder import DecoderRunner
from specpilot.policies import ConstantPolicy
from specpilot.policies.controller import EXPLORE_SAMPLES, GoodputController, GoodputPolicy
from specpilot.policies.latency import VerifyLatency
from specpilot.policies.sv import SvVerifyPolicy

PROMPTS = [[1, 5, 9, 14, 20, 7], [1, 30, 31, 30, 31, 30], [1, 7], [1, 60, 2, 61, 62, 63, 64, 65]]
BATCH = len(PROMPTS)
MAX_NEW = 24
DRAFTERS = ["model", "model-branches", "model-dynamic-tree", "ngram", "dvi", "dvi-own", "eagle"]
DRAFTERS += ["eagle-tree"]


@pytest.fixture(scope="module")
def target():
    return tiny_model("qwen2", seed=0, dtype=torch.float64)


@pytest.fixture(scope="module")
def reference(target):
    engine = SpeculativeEngine(DecoderRunner(target), TinyTokenizer(), eos_ids=set())
    return [engine.generate(p, GenerationConfig(max_new_tokens=MAX_NEW)).token_ids for p in PROMPTS]


def make_drafter(kind: str, runner: DecoderRunner, target):
    size = runner.batch_size
    if kind == "ngram":
        return NgramDrafter()
    if kind.startswith("model"):
        draft = DecoderRunner(perturbed(target, 0.3), batch_size=size)
        if kind == "model-branches":
            return ModelDrafter(draft, branches=3)
        return ModelDrafter(draft, topk=2 if kind == "model-dynamic-tree" else 1, nodes=6)
    if kind.startswith("dvi"):
        return LayerSplitDrafter(runner, DraftHead(runner, 2), share_cache=kind == "dvi")
    return EagleDrafter(runner, tiny_head(runner), depth=4, topk=3 if kind == "eagle-tree" else 1)


def engine_for(kind, target, policy, planner, batch_size=BATCH):
    runner = DecoderRunner(target, batch_size=batch_size)
    drafter = make_drafter(kind, runner, target)
    verifier = getattr(drafter, "verifier", None)
    return SpeculativeEngine(
        runner if verifier is None else verifier(runner),
        TinyTokenizer(),
        drafter,
        policy,
        eos_ids=set(),
        planner=planner,
    )


class ScriptedPlanner:
    """Budgets by a fixed pattern: each row in turn drafts its cap, one token or nothing, and
    every fourth step no row drafts. Records what it planned, and the rows' remaining tokens
    it was told."""

    reads_target_confidence = False

    def __init__(self) -> None:
        self.step = 0
        self.plans: list[list[int]] = []
        self.remaining: list[list[int] | None] = []

    def plan(self, policies, caps, remaining=None):
        self.step += 1
        self.remaining.append(remaining)
        if self.step % 4 == 0:
            budgets = [0] * len(caps)
        else:
            budgets = [(cap, 0, min(cap, 1))[(self.step + q) % 3] for q, cap in enumerate(caps)]
        self.plans.append(budgets)
        return budgets

    def observe(self, budgets, records, draft_s, verify_s, step_s) -> None:
        assert len(budgets) == len(records) and verify_s > 0 and step_s >= verify_s

    def retire(self, policy) -> None:
        """Nothing to learn from a request's end."""


def count_proposals(engine) -> list[list[int]]:
    """Wrap the drafter's propose to record the budgets it is called with."""
    calls: list[list[int]] = []
    propose = engine.drafter.propose

    def recorded(sequences, slots, budgets, *rest):
        calls.append(list(budgets))
        return propose(sequences, slots, budgets, *rest)

    engine.drafter.propose = recorded
    return calls


@pytest.mark.parametrize("kind", DRAFTERS)
def test_rows_with_budget_zero_stay_plain_greedy(target, reference, kind):
    planner = ScriptedPlanner()
    engine = engine_for(kind, target, ConstantPolicy(4), planner)
    calls = count_proposals(engine)
    results = engine.generate_batch(PROMPTS, GenerationConfig(max_new_tokens=MAX_NEW))
    assert [r.token_ids for r in results] == reference
    assert all(any(budgets) for budgets in calls)  # an all-zero step never calls the drafter
    assert len(calls) == sum(any(plan) for plan in planner.plans) < len(planner.plans)
    drafted = [rec.num_drafted for r in results for rec in r.stats.records]
    assert 0 in drafted and max(drafted) > 0
    if kind != "ngram":  # lookups may find nothing in these prompts
        assert sum(r.stats.accepted for r in results) > 0
    # generate_batch's caller waits for the last row: the planner gets the rows' remaining tokens
    assert planner.remaining[0] == [MAX_NEW] * BATCH and None not in planner.remaining


def test_a_server_scheduler_plans_for_throughput_not_to_finish_together(target, reference):
    planner = ScriptedPlanner()
    scheduler = Scheduler(engine_for("model", target, ConstantPolicy(4), planner))
    requests = [scheduler.submit(p, GenerationConfig(max_new_tokens=MAX_NEW)) for p in PROMPTS]
    scheduler.run()
    assert [r.result.token_ids for r in requests] == reference
    assert planner.remaining and set(planner.remaining) == {None}


class SyntheticTimes(GoodputController):
    """The controller fed timings of a made-up machine instead of the wall clock, so its plans
    are reproducible: T_verify(n) = 10 ms + `slope`·n, `unit` (4 ms) per draft unit."""

    def __init__(self, joint: bool, slope: float = 1e-3, unit: float = 0.004, **options) -> None:
        super().__init__(joint, **options)
        self.slope, self.unit = slope, unit
        self.plans: list[list[int]] = []

    def plan(self, policies, caps, remaining=None):
        budgets = super().plan(policies, caps, remaining)
        self.plans.append(budgets)
        return budgets

    def observe(self, budgets, records, draft_s, verify_s, step_s) -> None:
        fed = sum(1 + record.num_nodes for record in records)
        units = max(budgets) if self.joint else sum(budgets)
        verify_s, draft_s = 0.01 + self.slope * fed, self.unit * units
        super().observe(budgets, records, draft_s, verify_s, draft_s + verify_s)


@pytest.mark.parametrize("kind", ["model", "ngram", "dvi", "eagle-tree"])
@pytest.mark.parametrize("batch_size", [1, BATCH])
def test_controller_greedy_identity(target, reference, kind, batch_size):
    engine = engine_for(kind, target, GoodputPolicy(max_k=6), None, batch_size)
    engine.planner = SyntheticTimes(getattr(engine.drafter, "drafts_jointly", False))
    config = GenerationConfig(max_new_tokens=MAX_NEW)
    outputs = []
    for first in range(0, len(PROMPTS), batch_size):
        results = engine.generate_batch(PROMPTS[first : first + batch_size], config)
        outputs += [r.token_ids for r in results]
    assert outputs == reference
    planned = [k for plan in engine.planner.plans for k in plan]
    assert 0 in planned and max(planned) > 0  # the plain step and drafting both happen


def test_controller_waits_when_verification_is_dear(target, reference):
    """On a machine where each verified token costs as much as a step, drafting never pays:
    every drafting step is a probe (one token in one row): until a drafting step is timed, then
    until the first position's acceptance is known (EXPLORE_SAMPLES), then now and then."""
    engine = engine_for("model", target, GoodputPolicy(max_k=6), None)
    engine.planner = SyntheticTimes(True, slope=0.01)
    results = engine.generate_batch(PROMPTS, GenerationConfig(max_new_tokens=MAX_NEW))
    assert [r.token_ids for r in results] == reference
    explored = [plan for plan in engine.planner.plans if any(plan)]
    assert all(sorted(plan)[-2:] == [0, 1] for plan in explored)
    assert len(explored) <= EXPLORE_SAMPLES + 4


def sampling_engine(batch_size: int = 1, **timing):
    """The vocabulary-8 target of the chi-square suite; verification nearly free (unless
    `timing` says otherwise), so the controller drafts, and how far depends on the acceptance
    it has seen."""
    model = tiny_model("llama", vocab_size=VOCAB, seed=3)
    engine = SpeculativeEngine(
        DecoderRunner(model, batch_size=batch_size),
        TinyTokenizer(),
        ModelDrafter(DecoderRunner(perturbed(model, 1.0), batch_size=batch_size)),
        GoodputPolicy(max_k=3),
        eos_ids=set(),
        planner=SyntheticTimes(True, **{"slope": 1e-4, **timing}, probe_share=0.5),
    )
    return engine, model


class FirstRow:
    """Decodes each prompt as row 0 of a batch beside `mate`, through `generate`'s signature."""

    def __init__(self, engine: SpeculativeEngine, mate: list[int]):
        self.engine = engine
        self.mate = mate

    def generate(self, prompt, config):
        return self.engine.generate_batch([prompt, self.mate], config)[0]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t0.8-topk-topp"])
def test_controller_sampled_output_follows_target(sampling):
    engine, model = sampling_engine()
    expected = exact_joint_distribution(model, sampling, length=3)
    assert chi_square_pvalue(engine, expected, sampling, length=3) > 1e-3
    planned = {k for plan in engine.planner.plans for k in plan}
    assert len(planned) > 1  # budgets varied with what the controller learned


def test_confidence_stops_keep_the_sampled_distribution(monkeypatch):
    """Verification dear enough that drafting stops at draft distributions the calibration
    says are unlikely to be accepted: a stop before the token is drawn stays lossless."""
    admits, refused = GoodputPolicy.admits, []

    def counted(self, logits):
        allowed = admits(self, logits)
        refused.append(not allowed)
        return allowed

    monkeypatch.setattr(GoodputPolicy, "admits", counted)
    sampling = SAMPLINGS[0]
    engine, model = sampling_engine(slope=2e-3, unit=5e-4)
    expected = exact_joint_distribution(model, sampling, length=3)
    assert chi_square_pvalue(engine, expected, sampling, length=3) > 1e-3
    assert sum(refused) > 50


def test_controller_batched_row_follows_target():
    """A batched row's budget depends on its batchmate's forecast: its distribution, not its
    solo tokens, is what must be preserved."""
    sampling = SAMPLINGS[0]
    engine, model = sampling_engine(batch_size=2)
    expected = exact_joint_distribution(model, sampling, length=3)
    assert chi_square_pvalue(FirstRow(engine, [1, 6, 2, 7]), expected, sampling, length=3) > 1e-3


def test_sv_after_the_controller_skips_the_companion_when_nothing_is_drafted(target, reference):
    runner = DecoderRunner(target, batch_size=BATCH)
    latency = VerifyLatency([(1, 1.0), (2, 1.1), (4, 1.3), (8, 2.0), (32, 8.0)])
    sv = SvVerifyPolicy(runner.early_exit(2), table_from_a(), latency)
    companion_calls = []
    forward_batch = sv.companion.runner.forward_batch

    def counted(rows, *args, **kwargs):
        companion_calls.append([len(row) for row in rows])
        return forward_batch(rows, *args, **kwargs)

    sv.companion.runner.forward_batch = counted
    planner = ScriptedPlanner()
    engine = SpeculativeEngine(
        runner,
        TinyTokenizer(),
        ModelDrafter(DecoderRunner(perturbed(target, 0.3), batch_size=BATCH)),
        GoodputPolicy(max_k=4),
        sv,
        eos_ids=set(),
        planner=planner,
    )
    results = engine.generate_batch(PROMPTS, GenerationConfig(max_new_tokens=MAX_NEW))
    assert [r.token_ids for r in results] == reference
    assert len(companion_calls) == sum(any(plan) for plan in planner.plans)
