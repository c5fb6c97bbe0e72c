"""The goodput controller built by name, run through the engine and the CLI."""

from __future__ import annotations

import json

import pytest
from tiny import save_tiny

from specpilot.api import build_engine, load_models
from specpilot.cli import main
from specpilot.config import GenerationConfig
from specpilot.drafting import NgramDrafter
from specpilot.errors import ConfigError
from specpilot.methods import make_policy
from specpilot.methods.goodput import make_goodput, profile_cache_path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = save_tiny(tmp_path_factory.mktemp("goodput") / "target", seed=0)
    return load_models(str(folder), None, "float32", "cpu", 64)


def test_make_goodput_reads_a_cached_profile(models, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path))
    drafter = NgramDrafter()
    policy, planner, verify = make_goodput(models, drafter, max_k=5)
    assert policy.max_k == 5 and verify is None and not planner.costs.verify.points()
    path = profile_cache_path(models.target.name, models.target.runner.dtype)
    assert path.parent == tmp_path / "profiles" and path.name.endswith("-float32.json")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"verify_ms": {"128": [2.0, 2.5, 3.0]}}))
    _, planner, _ = make_goodput(models, drafter)
    assert planner.costs.verify(2) == pytest.approx(0.0025)
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
    assert list(engine.planner.catch_up.lifetimes) == [n for n, planned in retired if planned]
    engine.generate([5, 6], config)  # one request alone: the same path
    assert len(retired) == 4
    assert list(engine.planner.catch_up.lifetimes) == [n for n, planned in retired if planned]


def test_generate_with_goodput_policy(capsys, tmp_path):
    target = save_tiny(tmp_path / "target", seed=0)
    draft = save_tiny(tmp_path / "draft", seed=1)
    common = ["--target", str(target), "--dtype", "float32", "--max-new-tokens", "8"]
    for drafter in (["--draft", str(draft)], ["--drafter", "ngram"]):
        code = main(["generate", *common, *drafter, "--policy", "goodput", "--prompt", "w5 w6"])
        assert code == 0
    assert main(["generate", *common, "--policy", "goodput", "--k", "3", "--prompt", "w5"]) == 2
    assert "unknown option 'k' for drafter 'model' and policy 'goodput'" in capsys.readouterr().err


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
