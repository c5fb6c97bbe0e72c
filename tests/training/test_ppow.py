"""PPOW's pieces: the reward formulas (checked against the paper's Table 6), group advantages,
the clipped loss's gradient direction, the exact KL, ADAW's scores, pool and curriculum, windows
drafted exactly as the eagle drafter drafts them and judged exactly as the target would, and a
short resumable training run."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from eagle_fixtures import TinyLoaded, tiny_head, tiny_target
from tiny import cpu_training

from specpilot.config import SamplingConfig
from specpilot.drafting.eagle import EagleDrafter
from specpilot.drafting.eagle_head import EagleHead
from specpilot.errors import ConfigError
from specpilot.models.decoder import DecoderRunner
from specpilot.policies import ConstantPolicy
from specpilot.training.eagle.data import Sample
from specpilot.training.eagle.features import sequence_features
from specpilot.training.eagle.trainer import LOG_FILE
from specpilot.training.ppow import PpowConfig, adaw, continued_distillation, train_ppow
from specpilot.training.ppow import trainer as ppow_trainer
from specpilot.training.ppow.loss import exact_kl, ppow_loss
from specpilot.training.ppow.rewards import (
    accepted_length,
    group_advantages,
    proximity_reward,
    speed_reward,
)
from specpilot.training.ppow.windows import (
    candidate_windows,
    head_prefix,
    judge_windows,
    unroll_windows,
)


# -- rewards -----------------------------------------------------------------------------------
def test_speed_reward_reproduces_table_6():
    k = torch.arange(0, 8, dtype=torch.float64)
    table = [0.0, 0.89, 1.60, 2.18, 2.67, 3.08, 3.43, 3.74]
    # γ = 1/8 gives the table to its two printed decimals (its 3.74 is 3.733)
    assert speed_reward(k, 0.125).tolist() == pytest.approx(table, abs=0.007)
    assert float(speed_reward(torch.tensor(3.0), 0.12)) == pytest.approx(3 / 1.36)


def test_proximity_reward_only_for_empty_windows_near_the_reference():
    config = PpowConfig()
    k = torch.tensor([0.0, 0.0, 0.0, 2.0])
    window = torch.tensor([-10.3, -11.0, -9.0, -10.0])  # L(y)
    reference = torch.tensor(-10.0)  # L(ŷ): gaps 0.3, 1.0, −1.0 (one-sided: 0), −
    assert proximity_reward(k, window, reference, config).tolist() == [1.0, 0.0, 1.0, 0.0]
    absolute = dataclasses.replace(config, prox_absolute=True)
    assert proximity_reward(k, window, reference, absolute).tolist() == [1.0, 0.0, 0.0, 0.0]
    mean = dataclasses.replace(config, prox_mean=True)  # gaps ÷ K = 10
    assert proximity_reward(k, window, reference, mean).tolist() == [1.0, 1.0, 1.0, 0.0]
    soft = dataclasses.replace(config, prox_form="soft", prox_alpha=2.0)
    assert proximity_reward(k, window, reference, soft).tolist() == pytest.approx(
        [2 * (1 - 0.3 / 0.5), 0.0, 2.0, 0.0]
    )


def test_accepted_length_modes():
    log_p = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.1, 0.9, 0.9]]))
    log_q = torch.log(torch.tensor([[0.5, 0.4, 0.3], [0.2, 0.3, 0.3]]))
    # acceptance a = min(1, p/q): [1, 0.5, 1] and [0.5, 1, 1]
    uniforms = torch.tensor([[0.9, 0.4, 0.99], [0.6, 0.0, 0.0]])
    assert accepted_length(log_p, log_q, "sampled", uniforms).tolist() == [3.0, 0.0]
    uniforms = torch.tensor([[0.9, 0.6, 0.0], [0.1, 0.5, 0.5]])
    assert accepted_length(log_p, log_q, "sampled", uniforms).tolist() == [1.0, 3.0]
    expected = accepted_length(log_p, log_q, "expected").tolist()
    assert expected == pytest.approx([1 + 0.5 + 0.5, 0.5 + 0.5 + 0.5])
    best = torch.tensor([[True, True, False], [False, True, True]])
    assert accepted_length(log_p, log_q, "greedy", target_best=best).tolist() == [2.0, 0.0]


def test_group_advantages_are_normalised_per_group():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 6.0], [2.0, 2.0, 2.0, 2.0]])
    advantages = group_advantages(rewards)
    assert advantages[0].mean() == pytest.approx(0.0, abs=1e-6)
    assert advantages[0].std(unbiased=False) == pytest.approx(1.0, abs=1e-5)
    assert advantages[0].argsort().tolist() == [0, 1, 2, 3]
    assert advantages[1].tolist() == [0.0] * 4  # no preference inside an all-equal group


# -- loss --------------------------------------------------------------------------------------
def _loss_grad(advantage: float, shift: float = 0.0, beta: float = 0.0):
    """Gradient of the loss w.r.t. the drafter's logits for one window of one token (token 1),
    its old log-probability shifted by `shift` (ratio e^−shift)."""
    logits = torch.tensor([[[0.5, 0.2, -0.3]]], requires_grad=True)
    logp = F.log_softmax(logits, -1)
    tokens = torch.tensor([[1]])
    old = logp.detach()[..., 1] + shift
    target = F.log_softmax(torch.tensor([[[0.0, 1.0, 0.0]]]), -1)
    parts = ppow_loss(logp, tokens, old, torch.tensor([advantage]), target, 0.2, beta)
    parts.loss.backward()
    return logits.grad[0, 0], parts


def test_clipped_loss_moves_the_drafted_token_with_the_advantage():
    grad, _ = _loss_grad(1.0)
    assert grad[1] < 0  # a descent step raises the good window's token
    grad, _ = _loss_grad(-1.0)
    assert grad[1] > 0
    # A ratio already above 1 + ε with a positive advantage is clipped: no push further.
    grad, parts = _loss_grad(1.0, shift=-0.5)
    assert torch.allclose(grad, torch.zeros(3)) and parts.clip_fraction == 1.0
    # ...while a negative advantage at that ratio still pulls it back.
    grad, _ = _loss_grad(-1.0, shift=-0.5)
    assert grad[1] > 0
    # The KL term alone moves the drafter towards the target (which prefers token 1).
    grad, _ = _loss_grad(0.0, beta=1.0)
    assert grad[1] < 0


def test_exact_kl_both_directions():
    p = torch.tensor([0.7, 0.2, 0.1])
    q = torch.tensor([0.4, 0.4, 0.2])
    reverse = float(exact_kl(q.log(), p.log(), "reverse"))
    forward = float(exact_kl(q.log(), p.log(), "forward"))
    assert reverse == pytest.approx(float((q * (q / p).log()).sum()))
    assert forward == pytest.approx(float((p * (p / q).log()).sum()))
    assert reverse != pytest.approx(forward)
    assert float(exact_kl(p.log(), p.log(), "reverse")) == pytest.approx(0.0, abs=1e-7)


# -- ADAW --------------------------------------------------------------------------------------
def test_criticality_weights_divergence_by_target_confidence():
    confident = torch.tensor([[6.0, 0.0, 0.0, 0.0]])
    unsure = torch.tensor([[0.1, 0.0, 0.0, 0.0]])
    draft = torch.tensor([[0.0, 0.0, 3.0, 0.0]])
    scores = adaw.token_criticality(torch.cat([confident, unsure]), torch.cat([draft, draft]))
    p = F.softmax(confident[0], -1)
    confidence = 1 + float((p * p.log()).sum()) / math.log(4)
    kl = float((p * (p.log() - F.log_softmax(draft[0], -1))).sum())
    assert float(scores[0]) == pytest.approx(confidence * kl, rel=1e-5)
    assert scores[0] > 5 * scores[1]
    assert float(adaw.token_criticality(confident, confident)[0]) == pytest.approx(0, abs=1e-6)
    # Window means: prefix length L covers head positions L−2..L+K−3.
    tokens = torch.arange(10, dtype=torch.float32)
    means = adaw.window_criticality(tokens, torch.tensor([2, 5]), 3)
    assert means.tolist() == pytest.approx([1.0, 4.0])


def test_hard_pool_and_selection():
    scores = torch.tensor([0.1, 5.0, 0.3, 4.0, 0.2, 0.0, 0.4, 0.5, 0.6, 0.7])
    pool = adaw.hard_pool(scores, 0.2)
    assert sorted(pool.tolist()) == [1, 3]
    generator = torch.Generator().manual_seed(0)
    chosen = adaw.select_windows(10, 10, pool, 0.4, generator)
    assert len(chosen) == 10 and set(chosen[:4].tolist()) <= {1, 3}
    assert len(adaw.select_windows(5, 10, None, 0.6, generator)) == 5  # no pool: uniform
    # Windows of unscored sequences (−inf) never enter the pool; its size counts scored ones.
    partial = torch.tensor([0.1, float("-inf"), 0.3, float("-inf"), 0.2])
    assert adaw.hard_pool(partial, 0.5).tolist() == [2, 4]


@cpu_training
def test_adaw_scores_only_the_chosen_sequences(model):
    runner = DecoderRunner(model)
    head = tiny_head(runner, noise=0.3)
    rows = runner.lm_head[head.draft_ids].contiguous()
    samples = [SAMPLE, Sample("t", [1, 2, 3], [40, 41, 42, 43, 44, 45, 46])]
    candidates = candidate_windows(samples, 4)

    def features(sample):
        return sequence_features(runner, sample, head.shape.feature_layers, rows)

    every = adaw.score_windows(head, samples, candidates, features, 4, False, False)
    some = adaw.score_windows(head, samples, candidates, features, 4, False, False, [1])
    assert torch.isfinite(every).all() and (every >= 0).all()
    second = candidates[0] == 1
    torch.testing.assert_close(some[second], every[second])
    assert torch.isinf(some[~second]).all()


def test_curriculum_stages_and_refresh():
    config = PpowConfig(updates=100, adaw_start=10, adaw_refresh=30)
    fractions = [adaw.hard_fraction(u, config) for u in (0, 9, 10, 39, 40, 69, 70, 99)]
    assert fractions == [0.0, 0.0, 0.2, 0.2, 0.4, 0.4, 0.6, 0.6]
    assert [u for u in range(100) if adaw.refresh_due(u, config)] == [10, 40, 70]
    off = dataclasses.replace(config, adaw=False)
    assert adaw.hard_fraction(50, off) == 0.0 and not adaw.refresh_due(10, off)


def test_config_is_validated():
    bad_settings = (
        dict(group=1), dict(acceptance="mean"), dict(kl_direction="both"),
        dict(adaw_curriculum=(0.2, 1.5)), dict(clip_eps=0.0), dict(gamma=-1.0),
    )  # fmt: skip
    for bad in bad_settings:
        with pytest.raises(ConfigError):
            PpowConfig(**bad)


# -- windows -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return tiny_target(torch.float64)


SAMPLE = Sample("s", [1, 5, 9, 14], [20, 7, 33, 44, 60, 61, 62, 63, 64, 65, 66, 67, 8, 9])


def test_candidate_windows_cover_the_response():
    indices, lengths = candidate_windows([SAMPLE, Sample("t", [1, 2], [3, 4])], 4)
    assert indices.tolist() == [0] * 11
    assert lengths.tolist() == list(range(4, 15))  # L = 4 .. 18 − 4


@cpu_training
def test_unrolled_windows_draft_like_the_eagle_drafter(model):
    """The rollout's distributions at every window position equal the eagle drafter's chain,
    fed the same tokens: training sees exactly the regime decoding drafts in."""
    runner = DecoderRunner(model)
    head = tiny_head(runner, draft_vocab=80, noise=0.05)
    target_rows = runner.lm_head[head.draft_ids].contiguous()
    feats = sequence_features(runner, SAMPLE, head.shape.feature_layers, target_rows)
    ids = SAMPLE.token_ids
    window = 5
    with torch.no_grad():
        prefix = head_prefix(head, feats)
        for length in (4, 9):
            drafter = EagleDrafter(DecoderRunner(model), head, depth=window, topk=1, nodes=1)
            sequence = ids[:length]
            out = drafter.target.run_batch(
                [sequence[:-1]], [0], logits="none", tap_layers=drafter.feature_layers
            )
            taps = torch.cat([out[0].taps[k] for k in drafter.feature_layers], dim=-1)
            drafter.take_features(0, 0, taps, sequence[:-1])
            (proposal,) = drafter.propose(
                [sequence], [0], [window], [ConstantPolicy(window)], [SamplingConfig()], [None]
            )
            tokens = torch.searchsorted(head.draft_ids, torch.tensor(proposal.tokens))
            logp, _ = unroll_windows(
                head, prefix, feats, runner.embed, [length], 2, window,
                tokens=tokens.repeat(2, 1),
            )  # fmt: skip
            expected = F.log_softmax(proposal.draft_logits.double(), -1)
            torch.testing.assert_close(logp[0].double(), expected, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(logp[1], logp[0])


@cpu_training
def test_sampled_windows_follow_the_generator(model):
    runner = DecoderRunner(model)
    head = tiny_head(runner, noise=0.3)
    target_rows = runner.lm_head[head.draft_ids].contiguous()
    feats = sequence_features(runner, SAMPLE, head.shape.feature_layers, target_rows)
    prefix = head_prefix(head, feats)

    def draw(seed):
        generator = torch.Generator().manual_seed(seed)
        return unroll_windows(head, prefix, feats, runner.embed, [5, 6], 8, 4, generator=generator)[
            1
        ]

    assert torch.equal(draw(0), draw(0))
    assert draw(0).shape == (16, 4) and not torch.equal(draw(0)[0::2], draw(0)[1::2])


@cpu_training
@pytest.mark.parametrize("reference", ["response", "greedy"])
def test_judged_windows_equal_plain_target_forwards(model, reference):
    """One tree forward from the teacher-forced cache gives, for every drafted token, the
    log-probability a plain forward over prefix + window gives; ŷ's likelihood likewise."""
    runner = DecoderRunner(model, max_length=96)
    head = tiny_head(runner, draft_vocab=80)
    target_rows = runner.lm_head[head.draft_ids].contiguous()
    ids = SAMPLE.token_ids
    sequence_features(runner, SAMPLE, head.shape.feature_layers, target_rows, keep_cache=True)
    generator = torch.Generator().manual_seed(1)
    lengths, window = [4, 7, 11], 4
    drafted = head.draft_ids[torch.randint(0, 80, (3, 3, window), generator=generator)]
    drafted[1, 0] = torch.tensor(ids[7:11])  # one window drafts the response itself
    verdict = judge_windows(runner, ids, lengths, drafted, head.draft_ids, 1.0, reference)
    plain = DecoderRunner(model)
    for w, length in enumerate(lengths):
        for g in range(3):
            plain.reset()
            chain = drafted[w, g].tolist()
            logits = plain.forward(ids[:length] + chain[:-1], logits="all")[length - 1 :]
            logp = F.log_softmax(logits.double(), -1)
            expected = logp.gather(-1, drafted[w, g][:, None]).squeeze(-1)
            torch.testing.assert_close(verdict.logp[w, g].double(), expected, atol=1e-5, rtol=0)
            assert verdict.best[w, g].tolist() == (logp.argmax(-1) == drafted[w, g]).tolist()
            restricted = F.log_softmax(logits.double()[:, head.draft_ids], -1)
            torch.testing.assert_close(
                verdict.draft_logp[w, g].double(), restricted, atol=1e-5, rtol=0
            )
        plain.reset()
        if reference == "response":
            logits = plain.forward(ids[: length + window - 1], logits="all")[length - 1 :]
            truth = torch.tensor(ids[length : length + window])
            ref = F.log_softmax(logits.double(), -1).gather(-1, truth[:, None]).sum()
        else:
            ref, sequence = 0.0, ids[:length]
            for _ in range(window):
                plain.reset()
                logp = F.log_softmax(plain.forward(sequence, logits="last")[-1].double(), -1)
                ref += float(logp.max())
                sequence = sequence + [int(logp.argmax())]
        assert float(verdict.reference_logp[w]) == pytest.approx(float(ref), abs=1e-5)
    if reference == "response":  # the window that drafted the response scores as ŷ
        assert float(verdict.logp[1, 0].sum()) == pytest.approx(
            float(verdict.reference_logp[1]), abs=1e-5
        )
    assert runner.length == 0  # the cache is left reset


# -- training ----------------------------------------------------------------------------------
def _samples(count=8, length=24):
    generator = torch.Generator().manual_seed(0)
    return [
        Sample(f"s{i}", [1, 5, 6], torch.randint(4, 96, (length,), generator=generator).tolist())
        for i in range(count)
    ]


TRAIN = PpowConfig(
    updates=4, windows_per_update=2, window=4, group=4, gamma=0.12, lr=1e-3, valid_samples=2,
    eval_every=2, save_every=2, adaw_refresh=2, bf16=False,
)  # fmt: skip


@cpu_training
def test_training_runs_resumes_and_writes_a_loadable_head(tmp_path, monkeypatch):
    target = TinyLoaded(tiny_target(torch.float32))
    init = tiny_head(target.runner, draft_vocab=80, noise=0.3)
    samples = _samples()
    head = train_ppow(target, samples, tmp_path / "full", TRAIN, init, progress=False)
    rows = (tmp_path / "full" / LOG_FILE).read_text().splitlines()
    assert len(rows) == 2 + TRAIN.updates  # header, the initial head's eval, one per update
    assert rows[1].startswith("0,") and rows[1].split(",")[-1]
    assert (tmp_path / "full" / "ppow_curves.png").is_file()
    loaded = EagleHead.load(tmp_path / "full" / "head", expected=init.shape)
    assert any(
        not torch.equal(a, b) for a, b in zip(head.parameters(), init.parameters(), strict=True)
    )
    assert torch.equal(loaded.draft_ids, init.draft_ids)

    # Interrupted after the third update: re-running continues from the checkpoint at update 2
    # and ends exactly where the uninterrupted run did.
    calls = {"n": 0}
    real = ppow_trainer.ppow_update

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(ppow_trainer, "ppow_update", flaky)
    with pytest.raises(KeyboardInterrupt):
        train_ppow(target, samples, tmp_path / "cut", TRAIN, init, progress=False)
    monkeypatch.setattr(ppow_trainer, "ppow_update", real)
    resumed = train_ppow(target, samples, tmp_path / "cut", TRAIN, init, progress=False)
    for a, b in zip(head.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    cut_rows = (tmp_path / "cut" / LOG_FILE).read_text().splitlines()
    assert [r.split(",")[:8] for r in cut_rows] == [r.split(",")[:8] for r in rows]
    with pytest.raises(ConfigError, match="other settings"):
        train_ppow(
            target, samples, tmp_path / "cut", dataclasses.replace(TRAIN, group=8), init,
            progress=False,
        )  # fmt: skip


@cpu_training
def test_measured_gamma_and_bf16_rollouts(tmp_path):
    target = TinyLoaded(tiny_target(torch.float32))
    init = tiny_head(target.runner, noise=0.3)
    config = dataclasses.replace(
        TRAIN, updates=1, gamma=None, bf16=True, acceptance="expected", prox_reference="greedy"
    )
    train_ppow(target, _samples(), tmp_path, config, init, progress=False)
    state = torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=False)
    assert state["gamma"] > 0


@cpu_training
def test_continued_distillation_takes_the_same_number_of_updates(tmp_path):
    target = TinyLoaded(tiny_target(torch.float32))
    init = tiny_head(target.runner, draft_vocab=80, noise=0.3)
    config = dataclasses.replace(TRAIN, updates=3)
    head = continued_distillation(
        target, _samples(), tmp_path, config, init, batch_tokens=16, progress=False
    )
    rows = [r for r in (tmp_path / LOG_FILE).read_text().splitlines()[1:] if r.split(",")[3]]
    assert [int(r.split(",")[0]) for r in rows] == [1, 2, 3]
    assert torch.equal(head.draft_ids, init.draft_ids)  # continued from `init`, not rebuilt
