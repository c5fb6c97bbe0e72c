"""The KL→RL schedule (DVI paper §3.4; values: docs/methods.md §3.4) and what each ablation
objective turns on.

t counts training steps that updated (the paper counts optimizer updates; the same with one
update per step). The full objective starts as pure distillation (KL warm-up), ramps
the reward-masked term in while the KL weight falls, and from the end of warm-up adds the
on-policy REINFORCE step with a KL anchor β(t) that decays linearly.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.drafting.dvi_learning.config import DviTrainConfig


@dataclass(frozen=True)
class LossWeights:
    pg: float
    """λ_pg: the reward-masked NLL on accepted tokens (buffer batch)."""
    kl: float
    """λ_kl: distillation towards the verifier (buffer batch)."""
    ce: float
    entropy: float
    policy: bool
    """Whether the on-policy REINFORCE term (fresh tuples) is added."""
    anchor: float
    """β: weight of KL(p_target ‖ p_draft) in the policy term."""


def mix_schedule(t: int, config: DviTrainConfig) -> tuple[float, float]:
    """(λ_pg, λ_kl) at step t: (0, λ0) in warm-up, a linear ramp, then (λ_pg^max, λ_kl^min)."""
    if t < config.warmup_steps:
        return 0.0, config.kl_start
    s = min(1.0, (t - config.warmup_steps) / max(1, config.ramp_steps))
    return s * config.pg_max, config.kl_start - s * (config.kl_start - config.kl_min)


def anchor_beta(t: int, config: DviTrainConfig) -> float:
    """β(t) = β0 − (β0 − β_min)·min(1, t / T_anneal)."""
    fraction = min(1.0, t / config.anchor_steps)
    return config.anchor_start - (config.anchor_start - config.anchor_min) * fraction


def loss_weights(t: int, config: DviTrainConfig) -> LossWeights:
    if config.objective == "kl":
        return LossWeights(0.0, 1.0, 0.0, 0.0, False, 0.0)
    if config.objective == "pg":
        return LossWeights(0.0, 0.0, 0.0, 0.0, True, 0.0)
    if config.objective == "ce":
        return LossWeights(1.0, 0.0, 0.0, 0.0, False, 0.0)
    pg, kl = mix_schedule(t, config)
    return LossWeights(
        pg,
        kl,
        config.ce_weight,
        config.entropy_weight,
        t >= config.warmup_steps,
        anchor_beta(t, config),
    )
