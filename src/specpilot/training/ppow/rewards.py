"""PPOW's window reward (Performance-Driven Policy Optimization for Speculative Decoding with
Adaptive Windowing, §4.3) and group-relative advantages (§4.1).

All functions take a batch of windows: [..., K] per-token tensors, one row per drafted window.
"""

from __future__ import annotations

import torch

from specpilot.training.ppow.config import PpowConfig


def accepted_length(
    log_p: torch.Tensor,
    log_q: torch.Tensor,
    mode: str = "sampled",
    uniforms: torch.Tensor | None = None,
    target_best: torch.Tensor | None = None,
) -> torch.Tensor:
    """k per window ([..., K] → [...], float). log_p / log_q: the target's / drafter's
    log-probability of each drafted token. `sampled`: rejection sampling, token j accepted when
    u_j < a_j = min(1, p/q), k = the first rejection's index (`uniforms` [..., K] ~ U[0, 1));
    `expected`: E[k] = Σ_n Π_{j<=n} a_j; `greedy`: the longest prefix whose tokens are the target's
    argmax (`target_best` [..., K] bool)."""
    if mode == "greedy":
        hits = target_best
    else:
        accept = torch.exp(torch.clamp(log_p - log_q, max=0.0))
        if mode == "expected":
            return torch.cumprod(accept, dim=-1).sum(-1)
        hits = uniforms < accept
    return torch.cumprod(hits.long(), dim=-1).sum(-1).float()


def speed_reward(k: torch.Tensor, gamma: float) -> torch.Tensor:
    """Cost-aware speedup reward k / (kγ + 1): k accepted tokens cost k draft steps (kγ) plus one
    target step."""
    return k / (k * gamma + 1)


def proximity_reward(
    k: torch.Tensor, window_logp: torch.Tensor, reference_logp: torch.Tensor, config: PpowConfig
) -> torch.Tensor:
    """Partial credit for a window with no accepted token whose cumulative target log-likelihood
    L(y) comes close to the target-preferred window's L(ŷ): α·1[Δ < δ] (or the soft form
    α·max(0, 1 − Δ/δ)), Δ = max(0, L(ŷ) − L(y)) (or |·|; ÷K with prox_mean); 0 when k > 0.
    window_logp / reference_logp: [...] summed target log-probabilities of y and ŷ."""
    gap = reference_logp - window_logp
    gap = gap.abs() if config.prox_absolute else gap.clamp(min=0.0)
    if config.prox_mean:
        gap = gap / config.window
    if config.prox_form == "soft":
        credit = (1 - gap / config.prox_delta).clamp(min=0.0)
    else:
        credit = (gap < config.prox_delta).float()
    return torch.where(k == 0, config.prox_alpha * credit, torch.zeros_like(credit))


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """[..., G] rewards → (R − mean) / (std + eps) within each group (population std): every
    token of a window shares its window's advantage."""
    mean = rewards.mean(-1, keepdim=True)
    std = rewards.std(-1, keepdim=True, unbiased=False)
    return (rewards - mean) / (std + eps)
