"""Losslessness on the ggml backend (llama.cpp over float32 GGUF files written in the test):
greedy identity of n-gram, draft-model chains and draft-model trees (a draft on ggml too) with
plain ggml decoding under several policies, the goodput controller and SV (an early-exit
companion); batch rows equal single runs; sampled output follows the target's distribution by a
chi-square test that rejects a broken verifier (the helpers of test_engine_sampling, run through
ggml runners)."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

from gguf_fixtures import ggml_runner  # noqa: E402
from test_engine_sampling import (  # noqa: E402
    SAMPLINGS,
    VOCAB,
    accept_everything,
    chi_square_pvalue,
    exact_joint_distribution,
)
from test_sv import STEEP, table_from_a  # noqa: E402
from tiny import TinyTokenizer, perturbed, tiny_model  # noqa: E402

import specpilot.engine.speculative as speculative  # noqa: E402
from specpilot.config import GenerationConfig  # noqa: E402
from specpilot.drafting import ModelDrafter, NgramDrafter  # noqa: E402
from specpilot.engine import SpeculativeEngine  # noqa: E402
from specpilot.policies import ConstantPolicy, HeuristicPolicy, SvipPolicy  # noqa: E402
from specpilot.policies.controller import GoodputController, GoodputPolicy  # noqa: E402
from specpilot.policies.sv import SvVerifyPolicy  # noqa: E402

PROMPTS = [[1, 5, 9, 14], [1, 30, 31, 30, 31, 30], [1, 7], [1, 60, 2, 61, 62, 63, 64, 65]]
MAX_NEW = 24


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ggml")
    target = tiny_model("qwen2", seed=0)
    return {
        "target": (target, folder / "target.gguf"),
        "draft": (perturbed(target, 0.3), folder / "draft.gguf"),
    }


def runner(files, role: str, batch_size: int = 1):
    model, path = files[role]
    return ggml_runner(model, path, batch_size=batch_size)


@pytest.fixture(scope="module")
def reference(files):
    engine = SpeculativeEngine(runner(files, "target"), TinyTokenizer(), eos_ids=set())
    config = GenerationConfig(max_new_tokens=MAX_NEW)
    return {tuple(p): engine.generate(p, config).token_ids for p in PROMPTS}


def make_drafter(kind: str, files):
    if kind == "ngram":
        return NgramDrafter()
    return ModelDrafter(runner(files, "draft"), branches=3 if kind == "model-tree" else 1)


POLICIES = [ConstantPolicy(1), ConstantPolicy(4), HeuristicPolicy(), SvipPolicy(h=0.72, max_k=6)]


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
@pytest.mark.parametrize("kind", ["model", "model-tree", "ngram"])
def test_drafters_match_plain_ggml_greedy(files, reference, kind, policy):
    engine = SpeculativeEngine(
        runner(files, "target"), TinyTokenizer(), make_drafter(kind, files), policy, eos_ids=set()
    )
    accepted = 0
    for prompt in PROMPTS:
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
        assert result.token_ids == reference[tuple(prompt)]
        accepted += result.stats.accepted
    if kind.startswith("model"):
        assert accepted > 0, "the perturbed draft should get some tokens accepted"


@pytest.mark.parametrize("kind", ["model", "model-tree", "ngram"])
def test_goodput_controller_matches_plain_ggml_greedy(files, reference, kind):
    drafter = make_drafter(kind, files)  # ngram: prompt lookup's default on ggml
    engine = SpeculativeEngine(
        runner(files, "target"),
        TinyTokenizer(),
        drafter,
        GoodputPolicy(max_k=5),
        eos_ids=set(),
        planner=GoodputController(joint=drafter.drafts_jointly),
    )
    for prompt in PROMPTS:
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
        assert result.token_ids == reference[tuple(prompt)]


@pytest.mark.parametrize("batch_size", [1, len(PROMPTS)])
def test_sv_with_an_early_exit_companion_matches_plain_ggml_greedy(
    files, reference, batch_size, tmp_path, monkeypatch
):
    """SV on ggml: the companion is the target's first layer, written as a GGUF of its own."""
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path))
    target = runner(files, "target", batch_size)
    drafter = ModelDrafter(runner(files, "draft", batch_size))
    policy = SvVerifyPolicy(target.early_exit(1), table_from_a(), STEEP)
    engine = SpeculativeEngine(
        target, TinyTokenizer(), drafter, ConstantPolicy(4), policy, eos_ids=set()
    )
    config = GenerationConfig(max_new_tokens=MAX_NEW)
    if batch_size == 1:
        results = [engine.generate(prompt, config) for prompt in PROMPTS]
    else:
        results = engine.generate_batch(PROMPTS, config)
    assert [r.token_ids for r in results] == [reference[tuple(p)] for p in PROMPTS]
    records = [record for result in results for record in result.stats.records]
    assert any(r.num_verified < r.num_drafted for r in records), "SV should trim some drafts"


@pytest.mark.parametrize("kind", ["none", "model", "model-tree"])
def test_batch_rows_equal_single_runs(files, reference, kind):
    drafter = None if kind == "none" else make_drafter(kind, files)
    if drafter is not None:
        drafter.runner = runner(files, "draft", batch_size=len(PROMPTS))
    engine = SpeculativeEngine(
        runner(files, "target", batch_size=len(PROMPTS)),
        TinyTokenizer(),
        drafter,
        ConstantPolicy(3),
        eos_ids=set(),
    )
    results = engine.generate_batch(PROMPTS, GenerationConfig(max_new_tokens=MAX_NEW))
    for prompt, result in zip(PROMPTS, results, strict=True):
        assert result.token_ids == reference[tuple(prompt)]


@pytest.fixture(scope="module")
def sampling_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ggml-sampling")
    target = tiny_model("qwen2", vocab_size=VOCAB, seed=3)
    return {
        "target": (target, folder / "target.gguf"),
        "draft": (perturbed(target, 1.0), folder / "draft.gguf"),
    }


def sampling_engine(files, kind: str) -> SpeculativeEngine:
    return SpeculativeEngine(
        runner(files, "target"),
        TinyTokenizer(),
        make_drafter(kind, files),
        ConstantPolicy(2),
        eos_ids=set(),
    )


@pytest.mark.parametrize("kind", ["model", "model-tree", "ngram"])
def test_sampled_output_follows_target(sampling_files, kind):
    sampling = SAMPLINGS[1]
    expected = exact_joint_distribution(sampling_files["target"][0], sampling)
    engine = sampling_engine(sampling_files, kind)
    assert chi_square_pvalue(engine, expected, sampling) > 1e-3


def test_broken_verifier_is_detected(sampling_files, monkeypatch):
    sampling = SAMPLINGS[0]
    expected = exact_joint_distribution(sampling_files["target"][0], sampling)
    monkeypatch.setattr(speculative, "verify", accept_everything)
    assert chi_square_pvalue(sampling_engine(sampling_files, "model"), expected, sampling) < 1e-6
