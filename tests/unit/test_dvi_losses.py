"""DVI's loss terms, KL→RL schedule and training config (DVI paper §3.4;
docs/methods.md §3.3-3.4).

Every expected value is written out with scalar `math` formulas over explicit small numbers, so
the tests do not share code (or torch calls) with drafting/dvi_learning/losses.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from specpilot.drafting.dvi_head import LoraSettings
from specpilot.drafting.dvi_learning import losses
from specpilot.drafting.dvi_learning.config import DviTrainConfig
from specpilot.drafting.dvi_learning.schedule import (
    LossWeights,
    anchor_beta,
    loss_weights,
    mix_schedule,
)
from specpilot.errors import ConfigError

DRAFT = [[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]]
TARGET = [[0.3, 1.7, -0.4], [2.0, 0.1, 1.0]]
ACTIONS = [1, 2]


def log_softmax(row: list[float]) -> list[float]:
    total = sum(math.exp(x) for x in row)
    return [x - math.log(total) for x in row]


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def approx(value: torch.Tensor, expected: float) -> None:
    assert value.dim() == 0
    assert float(value) == pytest.approx(expected, rel=1e-12, abs=1e-14)


# -- loss terms ------------------------------------------------------------------------------
def test_log_softmax_helper_is_right():
    # e^1 + e^2 + e^0.5 = 2.718281828 + 7.389056099 + 1.648721271 = 11.756059198
    assert log_softmax(DRAFT[0])[1] == pytest.approx(2.0 - math.log(11.756059198), abs=1e-9)


@pytest.mark.parametrize(
    "rewards, expected",
    [
        # only row 0 accepted: −log p(a_0) / 1
        ([1.0, 0.0], lambda lp: -lp[0][1]),
        # both accepted: −(log p(a_0) + log p(a_1)) / 2
        ([1.0, 1.0], lambda lp: -(lp[0][1] + lp[1][2]) / 2),
        # only the second: −log p(a_1) / 1
        ([0.0, 1.0], lambda lp: -lp[1][2]),
        # nothing accepted: numerator 0, denominator max(1, 0) = 1 → exactly 0
        ([0.0, 0.0], lambda lp: 0.0),
    ],
)
def test_reward_masked_nll(rewards, expected):
    lp = [log_softmax(row) for row in DRAFT]
    value = losses.reward_masked_nll(t(DRAFT), torch.tensor(ACTIONS), t(rewards))
    approx(value, expected(lp))
    assert math.isfinite(float(value))


def test_reward_masked_nll_with_no_reward_has_zero_gradient():
    logits = t(DRAFT).requires_grad_()
    losses.reward_masked_nll(logits, torch.tensor(ACTIONS), t([0.0, 0.0])).backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def hand_kl(p_logits: list[float], q_logits: list[float]) -> float:
    """KL(softmax(p_logits) ‖ softmax(q_logits)) = Σ p (log p − log q)."""
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return sum(math.exp(a) * (a - b) for a, b in zip(lp, lq, strict=True))


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_distill_kl_forward(temperature):
    """Forward: KL(p_target^τ ‖ p_draft), τ divides the target logits only; batch mean."""
    expected = (
        sum(
            hand_kl([x / temperature for x in target], draft)
            for target, draft in zip(TARGET, DRAFT, strict=True)
        )
        / 2
    )
    approx(losses.distill_kl(t(DRAFT), t(TARGET), temperature, "forward"), expected)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_distill_kl_reverse(temperature):
    """Reverse: KL(p_draft ‖ p_target^τ)."""
    expected = (
        sum(
            hand_kl(draft, [x / temperature for x in target])
            for target, draft in zip(TARGET, DRAFT, strict=True)
        )
        / 2
    )
    approx(losses.distill_kl(t(DRAFT), t(TARGET), temperature, "reverse"), expected)


def test_distill_kl_directions_differ_and_vanish_on_equal_inputs():
    forward = losses.distill_kl(t(DRAFT), t(TARGET), 0.5, "forward")
    reverse = losses.distill_kl(t(DRAFT), t(TARGET), 0.5, "reverse")
    assert abs(float(forward) - float(reverse)) > 1e-3
    # p_target^τ with τ = 2 on logits 2x equals the draft: KL 0 both ways.
    doubled = t([[2 * x for x in row] for row in DRAFT])
    for direction in ("forward", "reverse"):
        assert float(losses.distill_kl(t(DRAFT), doubled, 2.0, direction)) == pytest.approx(
            0.0, abs=1e-14
        )


def test_distill_kl_float32_target_with_float64_draft():
    """The verifier's logits are float32 even for a float64 model: cast, same value."""
    value = losses.distill_kl(t(DRAFT), t(TARGET).float(), 1.0)
    expected = sum(hand_kl(a, b) for a, b in zip(TARGET, DRAFT, strict=True)) / 2
    assert float(value) == pytest.approx(expected, rel=1e-6)


def test_cross_entropy():
    labels = [1, 0]  # e.g. the verifier's argmax of TARGET rows
    lp = [log_softmax(row) for row in DRAFT]
    approx(losses.cross_entropy(t(DRAFT), torch.tensor(labels)), -(lp[0][1] + lp[1][0]) / 2)


def test_entropy():
    expected = 0.0
    for row in DRAFT:
        expected += -sum(math.exp(x) * x for x in log_softmax(row))
    approx(losses.entropy(t(DRAFT)), expected / 2)
    uniform = t([[0.7, 0.7, 0.7, 0.7]])
    approx(losses.entropy(uniform), math.log(4))


@pytest.mark.parametrize("baseline", [0.0, 0.3, 1.0])
def test_reinforce_with_baseline(baseline):
    rewards = [1.0, 0.0]
    lp = [log_softmax(row) for row in DRAFT]
    expected = -((1.0 - baseline) * lp[0][1] + (0.0 - baseline) * lp[1][2]) / 2
    approx(losses.reinforce(t(DRAFT), torch.tensor(ACTIONS), t(rewards), baseline), expected)


def test_reinforce_gradient_pushes_accepted_up_and_rejected_down():
    logits = t(DRAFT).requires_grad_()
    losses.reinforce(logits, torch.tensor(ACTIONS), t([1.0, 0.0]), 0.5).backward()
    # descending the loss raises the accepted action's logit and lowers the rejected one's
    assert logits.grad[0, 1] < 0 and logits.grad[1, 2] > 0


# -- schedule --------------------------------------------------------------------------------
T_VALUES = [0, 39, 40, 80, 120, 500, 2000, 3000]
# (λ_pg, λ_kl) with warmup 40, ramp 80, λ0 1, λ_kl^min 0.05, λ_pg^max 1:
# s = (t − 40) / 80 clamped to [0, 1]; λ_pg = s, λ_kl = 1 − 0.95 s.
MIX = {
    0: (0.0, 1.0),
    39: (0.0, 1.0),
    40: (0.0, 1.0),
    80: (0.5, 0.525),
    120: (1.0, 0.05),
    500: (1.0, 0.05),
    2000: (1.0, 0.05),
    3000: (1.0, 0.05),
}
# β(t) = 0.5 − 0.45 · min(1, t / 2000)
BETA = {
    0: 0.5,
    39: 0.491225,
    40: 0.491,
    80: 0.482,
    120: 0.473,
    500: 0.3875,
    2000: 0.05,
    3000: 0.05,
}


def test_defaults_are_the_recommended_ones():
    c = DviTrainConfig()
    assert (c.warmup_steps, c.ramp_steps, c.kl_start, c.kl_min, c.pg_max) == (40, 80, 1, 0.05, 1)
    assert (c.anchor_start, c.anchor_min, c.anchor_steps) == (0.5, 0.05, 2000)
    assert (c.ce_weight, c.entropy_weight, c.rl_weight, c.baseline_decay) == (0.1, 0, 1, 0.9)
    assert (c.objective, c.kl_direction, c.ce_target) == ("full", "forward", "verifier_argmax")


@pytest.mark.parametrize("step", T_VALUES)
def test_mix_schedule(step):
    pg, kl = mix_schedule(step, DviTrainConfig())
    assert pg == pytest.approx(MIX[step][0], abs=1e-12)
    assert kl == pytest.approx(MIX[step][1], abs=1e-12)


@pytest.mark.parametrize("step", T_VALUES)
def test_anchor_beta(step):
    assert anchor_beta(step, DviTrainConfig()) == pytest.approx(BETA[step], abs=1e-12)


@pytest.mark.parametrize("step", T_VALUES)
def test_loss_weights_full(step):
    w = loss_weights(step, DviTrainConfig())
    assert w.pg == pytest.approx(MIX[step][0], abs=1e-12)
    assert w.kl == pytest.approx(MIX[step][1], abs=1e-12)
    assert w.ce == pytest.approx(0.1) and w.entropy == 0.0
    assert w.policy is (step >= 40)
    assert w.anchor == pytest.approx(BETA[step], abs=1e-12)


@pytest.mark.parametrize("step", T_VALUES)
@pytest.mark.parametrize(
    "objective, expected",
    [
        # (λ_pg, λ_kl, w_ce, w_ent, policy, β): the paper's ablations, at every step
        ("kl", LossWeights(0.0, 1.0, 0.0, 0.0, False, 0.0)),
        ("pg", LossWeights(0.0, 0.0, 0.0, 0.0, True, 0.0)),
        ("ce", LossWeights(1.0, 0.0, 0.0, 0.0, False, 0.0)),
    ],
)
def test_loss_weights_ablations(step, objective, expected):
    assert loss_weights(step, DviTrainConfig(objective=objective)) == expected


def test_schedule_with_zero_ramp_and_warmup():
    config = DviTrainConfig(warmup_steps=0, ramp_steps=0)
    # s = min(1, (t − T_w) / max(1, T_ramp)) (the authors' clamp, docs/methods.md §3.4): with no
    # ramp the mix still starts at s = 0 on update T_w and is fully on from T_w + 1.
    assert mix_schedule(1, config) == (1.0, pytest.approx(0.05))
    assert loss_weights(0, config).policy is True
    custom = DviTrainConfig(warmup_steps=2, ramp_steps=4, kl_start=2.0, kl_min=0.5, pg_max=3.0)
    # s = (3 − 2) / 4 = 0.25: λ_pg = 0.75, λ_kl = 2 − 0.25·1.5 = 1.625
    assert mix_schedule(3, custom) == (pytest.approx(0.75), pytest.approx(1.625))


# -- config validation ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options, message",
    [
        ({"objective": "bogus"}, "objective must be one of full, kl, pg, ce"),
        ({"kl_direction": "sideways"}, "kl_direction"),
        ({"ce_target": "label"}, "ce_target"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"rollout_blocks": 0}, "rollout_blocks must be >= 1"),
        ({"buffer_capacity": 0}, "buffer_capacity must be >= 1"),
        ({"anchor_steps": 0}, "anchor_steps must be >= 1"),
        ({"batch_size": 64, "buffer_capacity": 32}, "buffer_capacity must be >= batch_size"),
        ({"warmup_steps": -1}, "warmup_steps must be >= 0"),
        ({"ramp_steps": -1}, "ramp_steps must be >= 0"),
        ({"kl_min": -0.1}, "kl_min must be >= 0"),
        ({"pg_max": -1.0}, "pg_max must be >= 0"),
        ({"ce_weight": -1.0}, "ce_weight must be >= 0"),
        ({"kl_temperature": 0.0}, "kl_temperature must be > 0"),
        ({"baseline_decay": 1.0}, "baseline_decay"),
        ({"baseline_decay": -0.1}, "baseline_decay"),
        ({"lr": 0.0}, "lr must be > 0"),
        ({"scale_lr": -1.0}, "scale_lr must be >= 0"),
        ({"grad_clip": 0.0}, "grad_clip must be > 0"),
    ],
)
def test_config_rejects_bad_values(options, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        DviTrainConfig(**options)


def test_config_accepts_edge_values():
    DviTrainConfig(warmup_steps=0, ramp_steps=0, kl_min=0.0, baseline_decay=0.0, scale_lr=0.0)
    DviTrainConfig(batch_size=8, buffer_capacity=8)


@pytest.mark.parametrize(
    "options, message",
    [({"rank": 0}, "rank"), ({"alpha": 0.0}, "alpha"), ({"dropout": 1.0}, "dropout")],
)
def test_lora_settings_reject_bad_values(options, message):
    with pytest.raises(ConfigError, match=message):
        LoraSettings(**options)
