"""Verifying a draft tree: walk from the root, at each node accept one child or emit a token.

Greedy: follow the child whose token is the target's argmax; where no child matches, emit the
argmax. Sampling: try the children in order with the target's distribution p at their parent:
a child x drawn from q (its draft_probs row) is accepted with probability min(1, p(x)/q(x)), a
deterministic child with probability p(x) (q one-hot); after a rejection p becomes
norm(max(p − q, 0)) (deterministic: p without x) and the next child is tried against it. When
every child is rejected, emit a sample of what p has become. Each step is the chain rule applied
to the current p, so the token taken at a node is distributed exactly as p (SpecInfer's
multi-candidate rule with one-hot candidates). That requires every child but the first to be
deterministic: a second sampled child would need its own q updated too, which no drafter here
needs, so it is rejected.
"""

from __future__ import annotations

import torch

from specpilot.config import SamplingConfig
from specpilot.sampling import logits_to_probs, sample
from specpilot.tree import children
from specpilot.types import VerifyResult
from specpilot.verify.rules import residual_distribution


def verify_tree(
    tokens: list[int],
    parents: tuple[int, ...],
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator | None,
) -> VerifyResult:
    """target_logits: [n + 1, vocab], row 0 scores the token after the root, row i + 1 the token
    after node i (fed with the tree mask of `specpilot.tree`)."""
    sampled = 0 if draft_probs is None else draft_probs.shape[0]
    kids = children(parents)
    path: list[int] = []
    row = 0
    while True:
        if sampling.greedy:
            best = int(target_logits[row].argmax())
            chosen = next((i for i in kids[row] if tokens[i] == best), None)
            if chosen is None:
                return VerifyResult(len(path), best, tuple(path))
        else:
            p = logits_to_probs(target_logits[row], sampling)
            chosen = None
            for order, i in enumerate(kids[row]):
                q = draft_probs[i] if i < sampled else None
                if q is not None and order > 0:
                    raise ValueError(f"tree node {i} is sampled but not its parent's first child")
                x = tokens[i]
                u = float(torch.rand(1, generator=generator, dtype=p.dtype))
                if u * (1.0 if q is None else float(q[x])) < float(p[x]):
                    chosen = i
                    break
                p = residual_distribution(p, q, x)
            if chosen is None:
                return VerifyResult(len(path), sample(p, generator), tuple(path))
        path.append(chosen)
        row = chosen + 1
