"""The engine reaches drafters and policies only through their declared protocols, and the
scheduler drives the engine only through its public surface (read from the source with the AST,
so a hook looked up by name or a private call cannot creep back in)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from eagle_fixtures import tiny_head
from ltd_fixtures import tiny_nets
from tiny import TinyTokenizer, tiny_model

from specpilot.drafting import ModelDrafter, NgramDrafter
from specpilot.drafting.base import (
    Drafter,
    FeatureDrafter,
    LearningDrafter,
    SharedTargetDrafter,
)
from specpilot.drafting.dvi_head import DraftHead
from specpilot.drafting.eagle import EagleDrafter
from specpilot.drafting.layer_split import LayerSplitDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.engine.target_pass import FeaturePass, TargetPass
from specpilot.models.decoder import DecoderRunner
from specpilot.policies.base import (
    BatchPlanner,
    CacheHolder,
    DrafterShapingPolicy,
    DraftPolicy,
    TimedPolicy,
    TreePolicy,
    VerifyPolicy,
)
from specpilot.policies.draft import ConstantPolicy
from specpilot.policies.ltd import LtdPolicy
from specpilot.policies.ltd_net import LtdShape
from specpilot.policies.sv import SvVerifyPolicy
from specpilot.policies.tree_goodput import TreeGoodputPolicy

SRC = Path(__file__).resolve().parents[2] / "src" / "specpilot"
ENGINE = sorted((SRC / "engine").glob("*.py"))


def members(*protocols) -> set[str]:
    """The names a protocol declares: its methods and annotated attributes, inherited ones too."""
    names = set()
    for protocol in protocols:
        for cls in protocol.__mro__:
            if cls.__module__.startswith("specpilot"):
                names |= {n for n in (*vars(cls), *cls.__dict__.get("__annotations__", {}))}
    return {n for n in names if not n.startswith("_")}


DRAFTER_HOOKS = members(Drafter, FeatureDrafter, LearningDrafter, SharedTargetDrafter, CacheHolder)
POLICY_HOOKS = members(DraftPolicy, VerifyPolicy, TreePolicy, TimedPolicy, CacheHolder)
SUBJECTS = {
    "drafter": DRAFTER_HOOKS,
    "learner": DRAFTER_HOOKS,
    "policy": POLICY_HOOKS,
    "draft_policy": POLICY_HOOKS,
    "verify_policy": POLICY_HOOKS,
    "planner": members(BatchPlanner),
    "plug": DRAFTER_HOOKS | POLICY_HOOKS,
}
"""The engine's names for a drafter or policy, and the hooks it may use on each."""


def subject(node: ast.expr) -> str | None:
    """`drafter` for `drafter`, `self.drafter`, `row.drafter` …; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def trees(paths):
    return [(path.name, ast.parse(path.read_text())) for path in paths]


def test_the_engine_looks_up_no_attribute_by_name_on_a_drafter_or_policy():
    """getattr/hasattr in engine/ only on the tokenizer (duck-typed by transformers) and the
    target's runner (whose capabilities are the runner protocol's business)."""
    allowed = {"tokenizer", "self.target"}
    found = [
        (name, node.lineno, ast.unparse(node.args[0]))
        for name, tree in trees(ENGINE)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
    ]
    assert found, "the scan found no lookup at all (the tokenizer's is expected)"
    assert [f for f in found if f[2] not in allowed] == []


def test_the_engine_uses_only_hooks_the_protocols_declare():
    used = [
        (name, node.lineno, subject(node.value), node.attr)
        for name, tree in trees(ENGINE)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and subject(node.value) in SUBJECTS
    ]
    assert {hook for *_, hook in used} >= {"propose", "observe", "take_features", "clear_cache"}
    assert [u for u in used if u[3] not in SUBJECTS[u[2]]] == []


def test_the_scheduler_drives_the_engine_through_its_public_surface():
    engine_attrs = [
        node.attr
        for _, tree in trees([SRC / "engine" / "scheduler.py"])
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and subject(node.value) == "engine"
    ]
    surface = {"encode", "stop_rule", "reset", "reusable", "prefill", "step"}
    assert surface <= set(engine_attrs)
    assert [a for a in engine_attrs if a.startswith("_")] == []
    for name in (*surface, "clear_cache"):
        assert callable(getattr(SpeculativeEngine, name)), name


def test_no_module_outside_drafting_calls_a_private_drafter_method():
    outside = [p for p in SRC.rglob("*.py") if "drafting" not in p.relative_to(SRC).parts]
    private = [
        (path.relative_to(SRC).as_posix(), node.lineno, node.attr)
        for path in outside
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and (subject(node.value) or "").endswith("drafter")
    ]
    assert private == []


@pytest.fixture(scope="module")
def runner():
    return DecoderRunner(tiny_model("qwen2", dtype=torch.float32), max_length=64)


def test_each_drafter_declares_the_protocols_the_engine_checks(runner):
    """What the engine does for a drafter follows from the protocols it meets: a feature
    drafter gets the feature pass, a learning drafter the verified chains."""
    eagle = EagleDrafter(runner, tiny_head(runner))
    dvi = LayerSplitDrafter(runner, DraftHead(runner, 2))
    model = ModelDrafter(DecoderRunner(tiny_model("qwen2", dtype=torch.float32), max_length=64))
    ngram = NgramDrafter()
    expected = [  # drafter, (feature, learning, shared target, cache holder)
        (eagle, (True, False, False, True)),
        (dvi, (False, True, True, True)),
        (model, (False, False, False, True)),
        (ngram, (False, False, False, False)),
    ]
    protocols = (FeatureDrafter, LearningDrafter, SharedTargetDrafter, CacheHolder)
    for drafter, kinds in expected:
        assert tuple(isinstance(drafter, p) for p in protocols) == kinds, type(drafter).__name__
        assert isinstance(drafter.drafts_jointly, bool)
        target = dvi.verifier(runner) if drafter is dvi else runner
        engine = SpeculativeEngine(target, TinyTokenizer(), drafter=drafter)
        assert type(engine.target_pass) is (FeaturePass if kinds[0] else TargetPass)
        assert (engine.learner is drafter) == kinds[1]
    assert eagle.default_budget == eagle.depth and model.default_budget is None


def test_policies_declare_their_optional_hooks():
    assert issubclass(LtdPolicy, TimedPolicy) and issubclass(LtdPolicy, DrafterShapingPolicy)
    assert issubclass(TreeGoodputPolicy, DrafterShapingPolicy)
    assert issubclass(SvVerifyPolicy, CacheHolder)
    assert not any(
        issubclass(ConstantPolicy, p) for p in (TimedPolicy, DrafterShapingPolicy, CacheHolder)
    )
    policy = LtdPolicy(tiny_nets(LtdShape(topk=2, max_depth=3, size_step=2, size_actions=3)))
    assert isinstance(policy, TimedPolicy) and policy.take_seconds() == 0.0
