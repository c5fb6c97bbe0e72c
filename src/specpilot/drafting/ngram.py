"""Prompt lookup (n-gram) drafting: no model, copy what followed the last occurrence of the
sequence's final n-gram. Cheap and strong on input-grounded tasks (code edits, summaries,
quoting); proposals are deterministic, so the verifier treats q as one-hot."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specpilot.config import SamplingConfig, require
from specpilot.policies.base import DraftPolicy, DraftToken
from specpilot.types import Proposal


@dataclass
class NgramDrafter:
    max_ngram: int = 3
    """Longest suffix n-gram to match; shorter ones are tried when it does not occur."""
    min_ngram: int = 1

    default_budget = None
    drafts_jointly = False
    """Row by row, at no model cost."""

    def __post_init__(self) -> None:
        require(1 <= self.min_ngram <= self.max_ngram, "need 1 <= min_ngram <= max_ngram")

    def reset(self) -> None:
        pass

    def lookup(self, sequence: list[int], budget: int) -> list[int]:
        """Tokens after the most recent earlier occurrence of the longest matching suffix."""
        for n in range(min(self.max_ngram, len(sequence) - 1), self.min_ngram - 1, -1):
            suffix = sequence[-n:]
            for start in range(len(sequence) - n - 1, -1, -1):
                if sequence[start : start + n] == suffix:
                    return sequence[start + n : start + n + budget]
        return []

    def propose(
        self,
        sequences: list[list[int]],
        slots: list[int],
        budgets: list[int],
        policies: list[DraftPolicy],
        samplings: list[SamplingConfig],
        generators: list[torch.Generator | None],
    ) -> list[Proposal]:
        """Row by row: lookup is stateless and needs no model (slots and sampling unused)."""
        return [
            self._propose_row(sequence, budget, policy) if budget > 0 else Proposal([])
            for sequence, budget, policy in zip(sequences, budgets, policies, strict=True)
        ]

    def _propose_row(self, sequence: list[int], budget: int, policy: DraftPolicy) -> Proposal:
        start = time.perf_counter()
        tokens: list[int] = []
        for token in self.lookup(sequence, budget):
            tokens.append(token)
            if not policy.continue_drafting(DraftToken(len(tokens) - 1, token, None)):
                break
        return Proposal(tokens, None, time.perf_counter() - start)
