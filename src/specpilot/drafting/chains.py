"""The drafting loop shared by model drafters: one scoring call per drafted position over the
rows still drafting, each row choosing its token and stopping at its own budget or policy.

With `branches` = m > 1 a proposal becomes a tree: the chain, plus the draft's m − 1 next most
likely first tokens as its first token's siblings. On a CPU the target verifies a few more
tokens in one forward for nearly the cost of one (the weights are read once), so a weak drafter
whose first guess is rarely right gets several guesses for the price of one scoring call.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from specpilot.config import SamplingConfig
from specpilot.models.vocab import DraftVocabulary
from specpilot.policies.base import DraftPolicy, DraftToken
from specpilot.sampling import logits_to_probs, sample
from specpilot.types import Proposal

Scorer = Callable[[list[int], list[list[int]]], torch.Tensor]
"""score(rows, feeds): feed each listed row its tokens; return [len(rows), draft vocab] logits
of the token that follows."""


def draft_chains(
    score: Scorer,
    feeds: list[list[int]],
    budgets: list[int],
    policies: list[DraftPolicy],
    samplings: list[SamplingConfig],
    generators: list[torch.Generator | None],
    vocabulary: DraftVocabulary | None = None,
    branches: int = 1,
) -> list[Proposal]:
    """Draft a chain per row: greedy or sampled (samplings[j]) from the draft logits (over
    `vocabulary` if given, reported over the full vocabulary), asking the row's policy before
    drawing each token and after it; with `branches` > 1, a tree (module docstring)."""
    start = time.perf_counter()
    tokens: list[list[int]] = [[] for _ in feeds]
    probs: list[list[torch.Tensor]] = [[] for _ in feeds]
    raw: list[list[torch.Tensor]] = [[] for _ in feeds]
    alternatives: list[list[int]] = [[] for _ in feeds]
    feeds = list(feeds)
    drafting = [j for j, budget in enumerate(budgets) if budget > 0]
    while drafting:
        logits = score(drafting, [feeds[j] for j in drafting])
        still = []
        for j, row_logits in zip(drafting, logits, strict=True):
            if not policies[j].admits(row_logits):
                continue
            if samplings[j].greedy:
                index = int(row_logits.argmax())
            else:
                row_probs = logits_to_probs(row_logits, samplings[j])
                index = sample(row_probs, generators[j])
                probs[j].append(
                    row_probs if vocabulary is None else vocabulary.to_full_probs(row_probs)
                )
            token = index if vocabulary is None else vocabulary.to_full_id(index)
            if branches > 1 and not tokens[j]:
                alternatives[j] = _runners_up(row_logits, index, branches - 1, vocabulary)
            tokens[j].append(token)
            raw[j].append(row_logits)
            drafted = DraftToken(len(tokens[j]) - 1, token, row_logits)
            if policies[j].continue_drafting(drafted) and len(tokens[j]) < budgets[j]:
                feeds[j] = [token]
                still.append(j)
        drafting = still
    seconds = time.perf_counter() - start
    return [
        Proposal(
            t + alt,
            torch.stack(p) if p else None,
            seconds,
            torch.stack(r) if r else None,
            (*range(-1, len(t) - 1), *[-1] * len(alt)) if alt else None,
        )
        for t, p, r, alt in zip(tokens, probs, raw, alternatives, strict=True)
    ]


def _runners_up(
    logits: torch.Tensor, chosen: int, count: int, vocabulary: DraftVocabulary | None
) -> list[int]:
    """The `count` most likely draft tokens other than index `chosen`, as full-vocabulary ids."""
    ranked = logits.topk(min(count + 1, logits.shape[-1])).indices.tolist()
    picked = [i for i in ranked if i != chosen][:count]
    return picked if vocabulary is None else [vocabulary.to_full_id(i) for i in picked]
