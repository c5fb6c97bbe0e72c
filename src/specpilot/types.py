"""Frozen records passed between the plugs of the decode loop.

Vocabulary (DESIGN.md §4): a step drafts `k` tokens; the target accepts `num_accepted` of them
(a prefix) and then emits one more token: a *recovered* token after a rejection, or a *bonus*
token when all k were accepted. So every verify step emits `num_accepted + 1` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Proposal:
    """What a drafter proposes for one step: a chain of tokens and how it drew them."""

    tokens: list[int]
    draft_probs: torch.Tensor | None = None
    """[k, vocab] distributions the tokens were sampled from; None means deterministic
    proposals (greedy drafting or n-gram lookup), treated as one-hot by the verifier."""
    draft_s: float = 0.0
    """Seconds spent drafting."""
    draft_logits: torch.Tensor | None = None
    """[k, draft vocab] raw logits the tokens came from (model drafters only): what verify
    policies such as SV compare a companion against."""

    @property
    def k(self) -> int:
        return len(self.tokens)

    def truncated(self, n: int) -> Proposal:
        """The first n tokens (a prefix is safe to verify: DESIGN.md §1)."""
        probs = None if self.draft_probs is None else self.draft_probs[:n]
        logits = None if self.draft_logits is None else self.draft_logits[:n]
        return Proposal(self.tokens[:n], probs, self.draft_s, logits)


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of verifying one proposal."""

    num_accepted: int
    next_token: int
    """The recovered token (after a rejection) or the bonus token (all accepted)."""

    def emitted(self, proposal_tokens: list[int]) -> list[int]:
        return list(proposal_tokens[: self.num_accepted]) + [self.next_token]


@dataclass(frozen=True)
class StepRecord:
    """Metrics of one verify step, as observed by policies and aggregated into stats."""

    num_drafted: int
    num_verified: int
    num_accepted: int
    num_emitted: int
    """Tokens actually appended (can be fewer than num_accepted + 1 at EOS or max length)."""
    draft_s: float
    verify_s: float
    context_len: int
