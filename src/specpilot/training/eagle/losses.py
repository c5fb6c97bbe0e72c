"""EAGLE-3's training objective with training-time test (Li et al. 2025).

For a sequence x_0..x_{T-1} with target taps f_t, the drafter's position t sees the pair
(feature, embedding of x_{t+1}) and predicts the target's distribution p_{t+1} (over x_{t+2}).
Step 1 uses the target's fused feature f_t. Step j > 1 uses the drafter's own step j − 1 output
at position t − 1, exactly as drafting does at depth j, and attends to what drafting would have
in its cache: step-1 keys at positions <= t − j + 1 (the committed prefix, built from target
features) plus one key from each later step on the diagonal (its own earlier draft positions).
Each step's loss is the soft cross-entropy to the target's distribution over the draft
vocabulary; step j is weighted decay^(j − 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specpilot.drafting.eagle_head import EagleHead


@dataclass
class UnrolledOutput:
    loss: torch.Tensor
    """Weighted sum over steps of the mean soft cross-entropy."""
    step_losses: list[float]
    correct: list[torch.Tensor]
    """Per step j (0-based): [n] bool, the drafter's argmax equals the target's at position t
    (False where step j is undefined, t < j, or outside the loss mask)."""
    valid: list[torch.Tensor]
    """Per step: [n] bool, the positions that step is scored on."""
    entropy: list[float]
    """Per step: the drafter's mean entropy (nats) over the draft vocabulary at the scored
    positions (0.0 where none are): whether training sharpens or flattens the head. Empty
    unless `diagnostics` was asked for (validation): training steps skip the extra pass."""
    overlap: list[float]
    """Per step: the mean of Σ_x min(p(x), q(x)) over the scored positions, target p and
    drafter q at temperature 1 (0.0 where none are): the chance that speculative sampling
    accepts the drafter's token there, which agreement of the argmaxes does not measure.
    Empty unless `diagnostics` was asked for."""


def training_time_test_mask(n: int, step: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive [n, step · n] mask for unroll step `step` (1-based) over keys [K_1 … K_step]."""
    t = torch.arange(n)[:, None]
    s = torch.arange(n)[None, :]
    blocks = [s <= t - step + 1]
    blocks += [s == t - step + i for i in range(2, step + 1)]
    allowed = torch.cat(blocks, dim=1)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, float("-inf"))


def unrolled_losses(
    head: EagleHead,
    taps: torch.Tensor,
    embeds: torch.Tensor,
    target_logits: torch.Tensor,
    loss_mask: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    steps: int = 3,
    decay: float = 0.8,
    diagnostics: bool = False,
) -> UnrolledOutput:
    """taps: [n, layers · h] target features at positions 0..n-1; embeds: [n, h] embeddings of
    x_1..x_n; target_logits: [n, draft vocab] the target's logits at positions 1..n over the draft
    vocabulary; loss_mask: [n] bool, which positions are scored; cos/sin: [n, head_dim].
    `diagnostics`: also measure each step's entropy and overlap (UnrolledOutput)."""
    n = taps.shape[0]
    target_logp = F.log_softmax(target_logits.float(), dim=-1)
    target_best = target_logp.argmax(-1)
    hidden = head.fuse(taps)
    keys, values = [], []
    total = hidden.new_zeros(())
    step_losses, correct, valid, entropy, overlap = [], [], [], [], []
    positions = torch.arange(n)
    out = hidden
    for step in range(1, steps + 1):
        if step > 1:  # own output of the previous step at position t − 1
            hidden = torch.cat([hidden.new_zeros(1, hidden.shape[1]), out[:-1]])
        mask = training_time_test_mask(n, step, hidden.dtype)
        past_k = torch.cat(keys, dim=1) if keys else None
        past_v = torch.cat(values, dim=1) if values else None
        out, k, v = head.block(hidden, embeds, cos, sin, past_k, past_v, mask)
        keys.append(k)
        values.append(v)
        scored = loss_mask & (positions >= step - 1)
        rows = scored.nonzero().squeeze(-1)
        if rows.numel() == 0:
            step_losses.append(0.0)
            correct.append(torch.zeros(n, dtype=torch.bool))
            valid.append(scored)
            if diagnostics:
                entropy.append(0.0)
                overlap.append(0.0)
            continue
        logits = head.logits(out[rows])
        draft_logp = F.log_softmax(logits, dim=-1)
        target_probs = target_logp[rows].exp()
        ce = -(target_probs * draft_logp).sum(-1).mean()
        if diagnostics:
            draft_probs = draft_logp.detach().exp()
            entropy.append(float(-(draft_probs * draft_logp.detach()).nansum(-1).mean()))
            overlap.append(float(torch.minimum(draft_probs, target_probs).sum(-1).mean()))
        total = total + decay ** (step - 1) * ce
        step_losses.append(float(ce.detach()))
        hits = torch.zeros(n, dtype=torch.bool)
        hits[rows] = logits.argmax(-1) == target_best[rows]
        correct.append(hits)
        valid.append(scored)
    return UnrolledOutput(total, step_losses, correct, valid, entropy, overlap)


def chain_accepted_length(correct: list[torch.Tensor], valid: list[torch.Tensor]) -> float:
    """Mean tokens per step of greedy chain drafting of depth len(correct), teacher-forced: from
    each position t where step 1 is scored, count consecutive hits of step j at t + j − 1
    (each step's input is exactly what drafting sees when the earlier guesses were right), + 1
    for the target's own token."""
    start = valid[0].nonzero().squeeze(-1)
    if start.numel() == 0:
        return float("nan")
    n = correct[0].shape[0]
    alive = torch.ones(start.shape, dtype=torch.bool)
    total = torch.ones(start.shape)
    for j, hits in enumerate(correct):
        at = start + j
        ok = torch.zeros(start.shape, dtype=torch.bool)
        inside = at < n
        ok[inside] = hits[at[inside]] & valid[j][at[inside]]
        alive &= ok
        total += alive.float()
    return float(total.mean())
