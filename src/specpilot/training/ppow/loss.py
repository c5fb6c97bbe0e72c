"""PPOW's objective (§4.1, App. A.2): a group-relative clipped surrogate on every drafted token
plus a target-anchored KL, computed exactly over the draft vocabulary (the drafter's full
distribution and the target's, restricted to the draft ids and renormalised, are both at hand:
no sampled estimator is needed)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossParts:
    loss: torch.Tensor
    kl: float
    """Mean KL per drafted position."""
    clip_fraction: float
    """Share of tokens whose ratio left [1 − ε, 1 + ε]."""


def exact_kl(draft_logp: torch.Tensor, target_logp: torch.Tensor, direction: str) -> torch.Tensor:
    """[..., V] log-distributions → [...]: KL(Q‖P) (`reverse`) or KL(P‖Q) (`forward`)."""
    if direction == "reverse":
        return (draft_logp.exp() * (draft_logp - target_logp)).sum(-1)
    return (target_logp.exp() * (target_logp - draft_logp)).sum(-1)


def ppow_loss(
    draft_logp: torch.Tensor,
    tokens: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    target_logp: torch.Tensor,
    clip_eps: float,
    kl_beta: float,
    kl_direction: str = "reverse",
) -> LossParts:
    """−J(θ): draft_logp [N, K, V] the current drafter's log-probabilities (with grad) at each
    window position; tokens [N, K] the drafted (draft-vocabulary) ids; old_logp [N, K] their
    log-probability under the policy that sampled them; advantages [N]; target_logp [N, K, V]
    the target's log-distribution over the draft vocabulary. Averaged over the K positions of a
    window, then over windows."""
    new_logp = draft_logp.gather(-1, tokens[..., None]).squeeze(-1)
    ratio = torch.exp(new_logp - old_logp)
    advantage = advantages[:, None]
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps)
    surrogate = torch.minimum(ratio * advantage, clipped * advantage)
    kl = exact_kl(draft_logp, target_logp, kl_direction)
    loss = (-surrogate + kl_beta * kl).mean(-1).mean()
    outside = ((ratio - 1).abs() > clip_eps).float().mean()
    return LossParts(loss, float(kl.detach().mean()), float(outside))
