"""Verification: keep the longest prefix of a draft the target agrees with, then emit one token.

Greedy: accept while the drafted token equals the target's argmax; then emit the target's argmax
(recovered after a mismatch, bonus after full acceptance). Sampling (Leviathan et al. / Chen et
al.): accept x ~ q with probability min(1, p(x)/q(x)); at the first rejection emit a sample of
norm(max(p − q, 0)); after full acceptance a sample of p at position k + 1. Either way, given the
target's logits, the emitted sequence is distributed exactly as the target's (greedy: identical to
plain greedy decoding; in bf16 a multi-token forward's logits differ from plain decoding's by
rounding, docs/methods.md §1.3).

These functions do not touch models or caches; they are the whole of the lossless promise and
are tested against `verify.reference` and by exact enumeration.
"""

from __future__ import annotations

import torch

from specpilot.config import SamplingConfig
from specpilot.sampling import logits_to_probs, sample
from specpilot.types import VerifyResult


def verify_greedy(draft_tokens: list[int], target_logits: torch.Tensor) -> VerifyResult:
    """target_logits: [k + 1, vocab], row i scores the token after draft_tokens[:i]."""
    target_choice = target_logits.argmax(-1).tolist()
    num_accepted = 0
    while (
        num_accepted < len(draft_tokens)
        and draft_tokens[num_accepted] == target_choice[num_accepted]
    ):
        num_accepted += 1
    return VerifyResult(num_accepted, target_choice[num_accepted])


def verify_sampling(
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> VerifyResult:
    """Rejection sampling. draft_probs: [k, vocab] or None (deterministic draft = one-hot q);
    target_probs: [k + 1, vocab]. Draws k uniforms, then at most one token, from `generator`."""
    k = len(draft_tokens)
    index = torch.tensor(draft_tokens, dtype=torch.long, device=target_probs.device)
    p = target_probs[:k].gather(-1, index[:, None]).squeeze(-1)  # [k]
    q = (
        torch.ones_like(p)
        if draft_probs is None
        else draft_probs.gather(-1, index[:, None]).squeeze(-1)
    )
    uniforms = torch.rand(k, generator=generator, dtype=p.dtype)
    p, q = p.to(uniforms.device), q.to(uniforms.device)  # the generator's (CPU) side
    rejected = (uniforms * q >= p).tolist()  # u < p/q accepts; written without dividing by q
    num_accepted = rejected.index(True) if True in rejected else k
    if num_accepted == k:
        return VerifyResult(k, sample(target_probs[k], generator))
    residual = residual_distribution(
        target_probs[num_accepted],
        None if draft_probs is None else draft_probs[num_accepted],
        draft_tokens[num_accepted],
    )
    return VerifyResult(num_accepted, sample(residual, generator))


def residual_distribution(
    target_row: torch.Tensor, draft_row: torch.Tensor | None, rejected_token: int
) -> torch.Tensor:
    """norm(max(p − q, 0)) over [vocab]: what to sample after rejecting `rejected_token`.

    With a deterministic draft (draft_row None, q = one-hot) this is p without the rejected token.
    """
    if draft_row is None:
        residual = target_row.clone()
        residual[rejected_token] = 0
    else:
        residual = (target_row - draft_row).clamp_min(0)
    if residual.sum() <= 0:  # p == q up to rounding: rejection had probability ~0; p is exact then
        residual = target_row
    return residual / residual.sum()


def verify(
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator | None,
) -> VerifyResult:
    """Dispatch on the sampling config. target_logits: [k + 1, vocab]."""
    if sampling.greedy:
        return verify_greedy(draft_tokens, target_logits)
    return verify_sampling(
        draft_tokens, draft_probs, logits_to_probs(target_logits, sampling), generator
    )
