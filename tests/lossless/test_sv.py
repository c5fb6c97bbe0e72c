"""SV keeps decoding lossless (greedy identity single and batched, sampled distribution) while
verifying only a prefix of each draft; and its parts: indicators, companion scoring, early exit,
profile recording, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_engine_sampling import (
    SAMPLINGS,
    VOCAB,
    chi_square_pvalue,
    exact_joint_distribution,
)
from tiny import TinyTokenizer, perturbed, tiny_model

from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.drafting import ModelDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.errors import ConfigError
from specpilot.models.decoder import DecoderRunner
from specpilot.policies import ConstantPolicy
from specpilot.policies.latency import VerifyLatency
from specpilot.policies.sv import Companion, SvVerifyPolicy, indicators, read_sv_profile
from specpilot.policies.sv_table import AcceptanceTable
from specpilot.types import Proposal

PROMPTS = [[1, 5, 9, 14], [1, 30, 31, 30, 31, 30], [1, 7], [1, 60, 2, 61, 62, 63, 64, 65]]


def table_from_a() -> AcceptanceTable:
    """p = A (roughly): synthetic records where acceptance follows the companion's A."""
    rng = np.random.default_rng(0)
    a = np.concatenate([rng.uniform(0, 1, 3000), np.ones(500)])
    s = rng.uniform(0, 1, a.size)
    return AcceptanceTable.fit(s, a, np.clip(a, 0, 1) ** 2, s_bins=4, a_bins=8)


# T(n) grows steeply with n, so SV verifies short prefixes and sometimes nothing (γ = 0).
STEEP = VerifyLatency([(1, 1.0), (2, 1.6), (3, 2.4), (8, 8.0)])


def sv_engine(target, draft, batch_size=1, layers=2, branches=1):
    target_runner = DecoderRunner(target, batch_size=batch_size)
    policy = SvVerifyPolicy(target_runner.early_exit(layers), table_from_a(), STEEP)
    engine = SpeculativeEngine(
        target_runner,
        TinyTokenizer(),
        ModelDrafter(DecoderRunner(draft, batch_size=batch_size), branches=branches),
        ConstantPolicy(4),
        policy,
        eos_ids=set(),
    )
    return engine


@pytest.fixture(scope="module")
def models():
    target = tiny_model("qwen2", seed=0, dtype=torch.float64)
    return target, perturbed(target, 0.3)


def test_sv_greedy_identity_single_and_batch(models):
    target, draft = models
    config = GenerationConfig(max_new_tokens=20)
    plain = SpeculativeEngine(DecoderRunner(target), TinyTokenizer(), eos_ids=set())
    reference = [plain.generate(p, config).token_ids for p in PROMPTS]
    single = sv_engine(target, draft)
    results = [single.generate(p, config) for p in PROMPTS]
    assert [r.token_ids for r in results] == reference
    verified = [rec.num_verified for r in results for rec in r.stats.records]
    drafted = [rec.num_drafted for r in results for rec in r.stats.records]
    assert 0 in verified and any(0 < v < d for v, d in zip(verified, drafted, strict=True))
    batched = sv_engine(target, draft, batch_size=len(PROMPTS))
    assert [r.token_ids for r in batched.generate_batch(PROMPTS, config)] == reference


def test_sv_with_draft_trees_is_a_clear_error(models):
    with pytest.raises(ConfigError, match="not draft trees"):
        sv_engine(*models, branches=2).generate(PROMPTS[0], GenerationConfig(max_new_tokens=4))


def sampling_setup(sampling: SamplingConfig):
    """The vocabulary-8 target of the chi-square suite with SV (early exit after 2 of 4 layers),
    and the exact distribution of its first three tokens."""
    target = tiny_model("llama", vocab_size=VOCAB, seed=3)
    runner = DecoderRunner(target)
    latency = VerifyLatency([(1, 1.0), (2, 1.3), (3, 1.9), (4, 3.0)])
    engine = SpeculativeEngine(
        runner,
        TinyTokenizer(),
        ModelDrafter(DecoderRunner(perturbed(target, 1.0))),
        ConstantPolicy(3),
        SvVerifyPolicy(runner.early_exit(2), table_from_a(), latency),
        eos_ids=set(),
    )
    return engine, exact_joint_distribution(target, sampling, length=3)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t0.8-topk-topp"])
def test_sv_sampled_output_follows_target(sampling):
    engine, expected = sampling_setup(sampling)
    assert chi_square_pvalue(engine, expected, sampling, length=3) > 1e-3


def test_indicators_on_hand_made_distributions():
    draft = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    companion = torch.tensor([[0.25, 0.25, 0.5], [0.2, 0.6, 0.2]])
    s, a = indicators(draft, companion, [0, 2])
    torch.testing.assert_close(s, torch.tensor([0.5, 0.2 + 0.3 + 0.2]))
    torch.testing.assert_close(a, torch.tensor([0.5, 0.4]))
    with pytest.raises(ConfigError, match="one vocabulary"):
        indicators(draft[:, :2], companion, [0, 1])


def test_companion_scores_teacher_forced_positions(models):
    target, _ = models
    companion = Companion(DecoderRunner(target).early_exit(4))  # all layers: the target itself
    sequence, drafted = [1, 5, 9], [14, 20, 3]
    scored = companion.score([sequence], [Proposal(drafted)], [0])[0]
    full = DecoderRunner(target).forward(sequence + drafted[:-1])
    torch.testing.assert_close(scored, full[-3:])
    # the next step re-synchronises: keep the accepted prefix, score new drafts
    again = companion.score([sequence + [14, 7]], [Proposal([8])], [0])[0]
    torch.testing.assert_close(again, DecoderRunner(target).forward([1, 5, 9, 14, 7])[-1:])


def test_early_exit_shares_weights_and_has_its_own_cache(models):
    target, _ = models
    runner = DecoderRunner(target)
    view = runner.early_exit(2)
    assert view.num_layers == 2 and view.layers[0] is runner.layers[0]
    assert view.lm_head.data_ptr() == runner.lm_head.data_ptr()
    view.forward([1, 2, 3])
    assert runner.length == 0 and view.length == 3
    with pytest.raises(ValueError, match="1..4 layers"):
        runner.early_exit(5)


def test_missing_or_bad_profile_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="profile-sv"):
        read_sv_profile(None)
    with pytest.raises(ConfigError, match="does not exist"):
        read_sv_profile(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"verify_ms": {}}')
    with pytest.raises(ConfigError, match="not an SV profile"):
        read_sv_profile(bad)


def test_greedy_indicators_use_temperature_one(models):
    """Under greedy decoding S and A compare the softmax distributions, not one-hot argmaxes."""
    from specpilot.policies.sv import indicator_probs

    logits = torch.tensor([[2.0, 1.0, 0.0]])
    probs = indicator_probs(logits, SamplingConfig())
    torch.testing.assert_close(probs, logits.softmax(-1))


def test_paper_rule_under_sampling_is_detected(monkeypatch):
    """Control: letting the decision for token i look at token i (the paper's p_i from A_i)
    biases the sampled output, and the chi-square test sees it."""

    original = SvVerifyPolicy.acceptance

    def acceptance(self, sequences, proposals, slots, samplings):
        forecasts, realized = original(self, sequences, proposals, slots, samplings)
        return realized, realized

    monkeypatch.setattr(SvVerifyPolicy, "acceptance", acceptance)
    sampling = SAMPLINGS[0]
    engine, expected = sampling_setup(sampling)
    assert chi_square_pvalue(engine, expected, sampling, length=3) < 1e-6


class _FirstRow:
    """Decodes each prompt as row 0 of a batch beside `mate`, through `generate`'s signature."""

    def __init__(self, engine: SpeculativeEngine, mate: list[int]):
        self.engine = engine
        self.mate = mate

    def generate(self, prompt, config):
        return self.engine.generate_batch([prompt, self.mate], config)[0]


def test_sv_batch_row_keeps_the_distribution_not_the_solo_tokens():
    """In a batch, SV allocates verification positions across rows, so a sampled row's tokens
    depend on its batchmate (they differ from a solo run with the same seed), but its output
    still follows the target's distribution."""
    sampling = SAMPLINGS[0]
    target = tiny_model("llama", vocab_size=VOCAB, seed=3)
    runner = DecoderRunner(target, batch_size=2)
    # Flat enough that batch rows verify drafts too, not only their pending token.
    latency = VerifyLatency([(1, 1.0), (2, 1.2), (3, 1.4), (4, 1.6), (8, 3.0)])
    engine = SpeculativeEngine(
        runner,
        TinyTokenizer(),
        ModelDrafter(DecoderRunner(perturbed(target, 1.0), batch_size=2)),
        ConstantPolicy(3),
        SvVerifyPolicy(runner.early_exit(2), table_from_a(), latency),
        eos_ids=set(),
    )
    batched = _FirstRow(engine, [1, 6, 2, 7])
    expected = exact_joint_distribution(target, sampling, length=3)
    assert chi_square_pvalue(batched, expected, sampling, length=3) > 1e-3
    prompt = [1, 3, 4, 5, 3, 4]
    differ, verified = 0, 0
    for seed in range(50):
        config = GenerationConfig(max_new_tokens=3, sampling=sampling, seed=seed)
        row = batched.generate(prompt, config)
        verified += sum(record.num_verified for record in row.stats.records)
        differ += row.token_ids != engine.generate(prompt, config).token_ids
    assert verified > 0 and differ > 0
