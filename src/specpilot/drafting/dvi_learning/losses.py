"""DVI's loss terms (DVI paper §3.4; choices: docs/methods.md §3.3) as pure functions of draft
logits and logged tuples.

All take `draft_logits` [n, V] (the draft head over the scored ids) and return a scalar.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _action_log_probs(draft_logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    return draft_logits.log_softmax(-1).gather(-1, actions[:, None]).squeeze(-1)


def reward_masked_nll(
    draft_logits: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor
) -> torch.Tensor:
    """L_pg = −Σ r_i log p_θ(a_i) / max(1, #{r_i > 0}): NLL of the accepted drafted tokens."""
    log_probs = _action_log_probs(draft_logits, actions)
    return -(rewards * log_probs).sum() / max(1, int((rewards > 0).sum()))


def distill_kl(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    temperature: float = 1.0,
    direction: str = "forward",
) -> torch.Tensor:
    """Batch-mean KL between the verifier at temperature τ and the draft head: forward
    KL(p_target^τ ‖ p_θ) (the authors' code) or reverse KL(p_θ ‖ p_target^τ) (the paper's text)."""
    target_log = (target_logits.to(draft_logits.dtype) / temperature).log_softmax(-1)
    draft_log = draft_logits.log_softmax(-1)
    if direction == "forward":
        kl = (target_log.exp() * (target_log - draft_log)).sum(-1)
    else:
        kl = (draft_log.exp() * (draft_log - target_log)).sum(-1)
    return kl.mean()


def cross_entropy(draft_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """L_CE = −mean log p_θ(label) (labels: the verifier's argmax by default)."""
    return F.cross_entropy(draft_logits, labels)


def entropy(draft_logits: torch.Tensor) -> torch.Tensor:
    """H[p_θ], batch mean."""
    log_probs = draft_logits.log_softmax(-1)
    return -(log_probs.exp() * log_probs).sum(-1).mean()


def reinforce(
    draft_logits: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, baseline: float
) -> torch.Tensor:
    """On-policy REINFORCE: mean(−(r − b) log p_θ(a))."""
    return -((rewards - baseline) * _action_log_probs(draft_logits, actions)).mean()
