"""DVI stays lossless (docs/methods.md §6, kinds 3-4): the layer-split self-drafter with a trained
(non-zero) LoRA head, with or without a shared cache, a reduced draft vocabulary and online
learning, reproduces plain greedy decoding token for token (alone and batched), and under
sampling emits tokens that follow the target's distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from test_engine_sampling import PROMPT, VOCAB, accept_everything, exact_joint_distribution
from tiny import TinyTokenizer, seeded_noise, tiny_model

import specpilot.engine.speculative as speculative
from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.drafting.dvi_head import DraftHead
from specpilot.drafting.dvi_learning import DviLearner, DviTrainConfig
from specpilot.drafting.layer_split import LayerSplitDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.models.decoder import DecoderRunner
from specpilot.policies import ConstantPolicy, SvipPolicy

PROMPTS = [[1, 5, 9, 14], [1, 30, 31, 30, 31, 30], [1, 7], [1, 60, 2, 61, 62, 63, 64, 65]]
MAX_NEW = 40


@pytest.fixture(scope="module")
def target_model():
    return tiny_model("qwen2", seed=0, dtype=torch.float64)


@pytest.fixture(scope="module")
def reference(target_model):
    engine = SpeculativeEngine(DecoderRunner(target_model), TinyTokenizer(), eos_ids=set())
    config = GenerationConfig(max_new_tokens=MAX_NEW)
    return [engine.generate(p, config).token_ids for p in PROMPTS]


def trained_head(runner, split, token_ids=None, std=0.5, seed=0) -> DraftHead:
    head = DraftHead(runner, split, token_ids=token_ids)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.lora_parameters():
            p.copy_(seeded_noise(p, generator) * std)
        head.log_scale.fill_(-0.3)
    assert head.lora.lora_B["default"].weight.abs().min() > 0
    return head


def dvi_drafter(runner, split, share_cache, subvocab, learn, std=0.5):
    head = trained_head(runner, split, torch.arange(40) if subvocab else None, std=std)
    learner = None
    if learn:
        config = DviTrainConfig(batch_size=8, rollout_blocks=2, warmup_steps=1, ramp_steps=2)
        learner = DviLearner(head, config)
    return LayerSplitDrafter(
        runner,
        head,
        share_cache=share_cache,
        explore_temperature=1.0 if learn else 0.0,
        learner=learner,
    )


# (share_cache, split, reduced vocabulary, learning online): every cache mode with both splits,
# each of reduced vocabulary and learning under both cache modes
CASES = [
    (True, 1, False, False),
    (True, 2, False, False),
    (True, 2, True, True),
    (False, 1, True, False),
    (False, 2, False, True),
    (False, 2, True, True),
]


def case_id(case) -> str:
    share, split, subvocab, learn = case
    parts = ["shared" if share else "own-cache", f"split{split}"]
    return "-".join(parts + ["subvocab"] * subvocab + ["learn"] * learn)


@pytest.mark.parametrize("share_cache,split,subvocab,learn", CASES, ids=map(case_id, CASES))
def test_dvi_matches_plain_greedy(target_model, reference, share_cache, split, subvocab, learn):
    runner = DecoderRunner(target_model)
    drafter = dvi_drafter(runner, split, share_cache, subvocab, learn)
    engine = SpeculativeEngine(
        drafter.target, TinyTokenizer(), drafter, ConstantPolicy(4), eos_ids=set()
    )
    drafted = accepted = 0
    for prompt, expected in zip(PROMPTS, reference, strict=True):
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
        assert result.token_ids == expected
        assert result.finish_reason == "length"
        drafted += result.stats.drafted
        accepted += result.stats.accepted
        assert runner.length == len(prompt) + MAX_NEW - 1  # cache holds the committed prefix
        if share_cache:
            assert runner.slot_lengths[0] == [runner.length] * runner.num_layers
    assert drafted > 0
    if learn:
        assert drafter.learner.updates > 0, "the head should have learned while decoding"
        assert drafter.learner.buffer.size > 0
    if subvocab:
        assert all(t < 40 for t in drafter.blocks[0].tokens[1:])


def test_dvi_greedy_with_accepting_head_and_svip(target_model, reference):
    """A nearly untrained head (small LoRA) gets long runs accepted; a data-dependent draft
    length (SVIP) and an EOS inside a draft must still reproduce plain decoding."""
    runner = DecoderRunner(target_model)
    drafter = LayerSplitDrafter(runner, trained_head(runner, 3, std=0.02))
    engine = SpeculativeEngine(
        drafter.target, TinyTokenizer(), drafter, SvipPolicy(h=0.72, max_k=6), eos_ids=set()
    )
    accepted = 0
    for prompt, expected in zip(PROMPTS, reference, strict=True):
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
        assert result.token_ids == expected
        accepted += result.stats.accepted
    assert accepted >= 10
    eos = reference[1][9]
    plain = SpeculativeEngine(DecoderRunner(target_model), TinyTokenizer(), eos_ids={eos})
    expected = plain.generate(PROMPTS[1], GenerationConfig(max_new_tokens=MAX_NEW))
    engine = SpeculativeEngine(
        drafter.target, TinyTokenizer(), drafter, ConstantPolicy(5), eos_ids={eos}
    )
    result = engine.generate(PROMPTS[1], GenerationConfig(max_new_tokens=MAX_NEW))
    assert result.token_ids == expected.token_ids and result.finish_reason == "eos"


@pytest.mark.parametrize("share_cache", [True, False], ids=["shared", "own-cache"])
def test_dvi_greedy_when_steps_draft_nothing(target_model, reference, share_cache):
    """SVIP stopping before uncertain tokens: some steps draft nothing and are plain steps
    (under sharing, through the deep layers on the h_k drafting computed)."""
    runner = DecoderRunner(target_model)
    drafter = LayerSplitDrafter(runner, trained_head(runner, 3, std=0.02), share_cache)
    policy = SvipPolicy(h=0.72, max_k=6, keep_uncertain=False)
    engine = SpeculativeEngine(drafter.target, TinyTokenizer(), drafter, policy, eos_ids=set())
    empty = drafted = 0
    for prompt, expected in zip(PROMPTS, reference, strict=True):
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
        assert result.token_ids == expected
        empty += sum(record.num_drafted == 0 for record in result.stats.records)
        drafted += result.stats.drafted
    assert empty > 0 and drafted > 0, (empty, drafted)


@pytest.mark.parametrize(
    "share_cache,learn", [(True, False), (False, True)], ids=["shared", "own-cache-learn"]
)
def test_dvi_batch_rows_match_plain_greedy(target_model, reference, share_cache, learn):
    prompts = PROMPTS[:3]
    runner = DecoderRunner(target_model, batch_size=3)
    drafter = dvi_drafter(runner, 2, share_cache, subvocab=learn, learn=learn, std=0.1)
    engine = SpeculativeEngine(
        drafter.target, TinyTokenizer(), drafter, ConstantPolicy(3), eos_ids=set()
    )
    results = engine.generate_batch(prompts, GenerationConfig(max_new_tokens=MAX_NEW))
    assert [r.token_ids for r in results] == reference[:3]
    assert sum(r.stats.accepted for r in results) > 0
    # a second batch on the same engine (caches and drafter state reset) is exact too
    again = engine.generate_batch(prompts[::-1], GenerationConfig(max_new_tokens=MAX_NEW))
    assert [r.token_ids for r in again] == reference[:3][::-1]


def test_dvi_tree_matches_plain_greedy_and_accepts_more(target_model, reference):
    """Trees (the head's top 4 first tokens) reproduce plain decoding and accept more tokens
    than the chain alone."""
    accepted = {}
    for branches in (1, 4):
        runner = DecoderRunner(target_model)
        head = trained_head(runner, 2)
        drafter = LayerSplitDrafter(runner, head, share_cache=False, branches=branches)
        engine = SpeculativeEngine(
            runner, TinyTokenizer(), drafter, ConstantPolicy(2), eos_ids=set()
        )
        accepted[branches] = 0
        for prompt, expected in zip(PROMPTS, reference, strict=True):
            result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
            assert result.token_ids == expected
            accepted[branches] += result.stats.accepted
            assert runner.length == len(prompt) + MAX_NEW - 1
    assert accepted[4] > accepted[1], accepted


@pytest.mark.parametrize(
    "share_cache,branches", [(True, 1), (False, 1), (False, 6)], ids=["shared", "own", "tree"]
)
def test_dvi_runs_to_the_end_of_the_context(target_model, share_cache, branches):
    """Drafts (and the extra shallow step for the last one) must fit in the KV cache right up to
    its last position, trees being cut to what fits; the output equals plain decoding with the
    same context."""
    prompt = list(range(3, 23))
    config = GenerationConfig(max_new_tokens=50)
    plain = SpeculativeEngine(DecoderRunner(target_model, 32), TinyTokenizer(), eos_ids=set())
    expected = plain.generate(prompt, config)
    runner = DecoderRunner(target_model, 32)
    head = trained_head(runner, 2, std=0.02)
    drafter = LayerSplitDrafter(runner, head, share_cache, branches=branches)
    engine = SpeculativeEngine(
        drafter.target, TinyTokenizer(), drafter, ConstantPolicy(5), eos_ids=set()
    )
    result = engine.generate(prompt, config)
    assert result.token_ids == expected.token_ids
    assert result.finish_reason == "length" and len(prompt) + len(result.token_ids) == 32


# -- sampling --------------------------------------------------------------------------------
TRIALS = 700


@pytest.fixture(scope="module")
def small_target():
    """The 8-token Llama of test_engine_sampling (PROMPT, VOCAB and the exact distribution come
    from there too)."""
    return tiny_model("llama", vocab_size=VOCAB, seed=3)


def sampling_engine(model, share_cache=True, subvocab=False, explore=0.0):
    """DVI on split 3 with a small random LoRA: the first draft token is accepted about 70% of
    the time (TV(p, q) ≈ 0.3), so acceptance, rejection and residual sampling all occur."""
    runner = DecoderRunner(model, max_length=16)
    head = trained_head(runner, 3, torch.arange(6) if subvocab else None, std=0.1)
    drafter = LayerSplitDrafter(runner, head, share_cache=share_cache, explore_temperature=explore)
    # every id ends generation: each trial stops after its first emitted token (one step)
    return SpeculativeEngine(
        drafter.target, TinyTokenizer(), drafter, ConstantPolicy(2), eos_ids=set(range(VOCAB))
    )


def first_token_pvalue(
    engine, sampling: SamplingConfig, expected: torch.Tensor, trials: int = TRIALS
) -> tuple[float, float]:
    """Chi-square p-value of the first emitted token over `trials` seeds (max_new_tokens=2, so
    the first step drafts a token) against the target's next-token distribution; and the
    fraction of drafts accepted."""
    counts = np.zeros(VOCAB)
    drafted = accepted = 0
    for seed in range(trials):
        result = engine.generate(PROMPT, GenerationConfig(2, sampling, seed=seed))
        counts[result.token_ids[0]] += 1
        drafted += result.stats.drafted
        accepted += result.stats.accepted
    assert drafted == trials, "every trial should draft one token"
    wanted = expected.numpy() * trials
    if counts[wanted == 0].any():
        return 0.0, accepted / trials  # a token the target can never emit
    keep = wanted >= 5  # pool rare cells so the chi-square approximation holds
    observed = np.append(counts[keep], counts[~keep].sum())
    wanted = np.append(wanted[keep], wanted[~keep].sum())
    if wanted[-1] == 0:
        observed, wanted = observed[:-1], wanted[:-1]
    pvalue = float(chisquare(observed, wanted * observed.sum() / wanted.sum()).pvalue)
    return pvalue, accepted / trials


def test_dvi_sampling_follows_target(small_target):
    sampling = SamplingConfig(temperature=1.0)
    expected = exact_joint_distribution(small_target, sampling, length=1)
    pvalue, acceptance = first_token_pvalue(sampling_engine(small_target), sampling, expected)
    assert 0.3 < acceptance < 0.95, "want both accepted and rejected drafts"
    assert pvalue > 1e-3


def test_dvi_sampling_subvocab_exploring_own_cache_follows_target(small_target):
    """A reduced draft vocabulary (q = 0 on ids 6, 7), drafts sampled at the exploration
    temperature 1.5 (the q the verifier sees must be that one), and top-k/top-p decoding."""
    sampling = SamplingConfig(temperature=0.8, top_k=5, top_p=0.9)
    expected = exact_joint_distribution(small_target, sampling, length=1)
    assert (expected == 0).any()
    engine = sampling_engine(small_target, share_cache=False, subvocab=True, explore=1.5)
    pvalue, acceptance = first_token_pvalue(engine, sampling, expected)
    assert 0.3 < acceptance < 0.95, "want both accepted and rejected drafts"
    assert pvalue > 1e-3


def test_broken_verifier_is_detected(small_target, monkeypatch):
    """The same check rejects a verifier that accepts every DVI draft (the output then follows
    the draft head), so the tests above can fail."""
    sampling = SamplingConfig(temperature=1.0)
    expected = exact_joint_distribution(small_target, sampling, length=1)
    monkeypatch.setattr(speculative, "verify", accept_everything)
    engine = sampling_engine(small_target)
    pvalue, acceptance = first_token_pvalue(engine, sampling, expected, trials=250)
    assert acceptance == 1.0
    assert pvalue < 1e-6
