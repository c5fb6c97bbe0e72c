"""Slow, obviously-correct verification written as plain loops; tests compare `rules` to it.

It draws random numbers in the same order as `rules.verify_sampling` (k uniforms, then at most one
token), so with equally seeded generators both must return the same result.
"""

from __future__ import annotations

import torch

from specpilot.types import VerifyResult


def reference_verify_greedy(draft_tokens: list[int], target_logits: torch.Tensor) -> VerifyResult:
    for i, token in enumerate(draft_tokens):
        best = int(torch.argmax(target_logits[i]))
        if token != best:
            return VerifyResult(i, best)
    return VerifyResult(len(draft_tokens), int(torch.argmax(target_logits[len(draft_tokens)])))


def reference_verify_sampling(
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> VerifyResult:
    k = len(draft_tokens)
    uniforms = torch.rand(k, generator=generator, dtype=target_probs.dtype).tolist()
    vocab = target_probs.shape[-1]
    for i, token in enumerate(draft_tokens):
        p = float(target_probs[i, token])
        q = 1.0 if draft_probs is None else float(draft_probs[i, token])
        if uniforms[i] < p / q:
            continue
        residual = torch.zeros(vocab, dtype=target_probs.dtype)
        for v in range(vocab):
            q_v = (1.0 if v == token else 0.0) if draft_probs is None else float(draft_probs[i, v])
            residual[v] = max(float(target_probs[i, v]) - q_v, 0.0)
        if residual.sum() <= 0:
            residual = target_probs[i].clone()
        return VerifyResult(
            i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
        )
    return VerifyResult(k, int(torch.multinomial(target_probs[k], 1, generator=generator)))
