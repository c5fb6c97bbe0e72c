"""Frozen records passed between the plugs of the decode loop.

Vocabulary (README, "Vocabulary"): a step drafts `k` tokens; the target accepts `num_accepted`
of them (a prefix) and then emits one more token: a *recovered* token after a rejection, or a
*bonus* token when all k were accepted. So every verify step emits `num_accepted + 1` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.tree import tree_depths


@dataclass(frozen=True)
class Proposal:
    """What a drafter proposes for one step: a chain (or tree) of tokens and how it drew them."""

    tokens: list[int]
    draft_probs: torch.Tensor | None = None
    """[rows, vocab] distributions the first `rows` tokens were sampled from; None (or a token
    past the last row) means a deterministic proposal (greedy drafting, n-gram lookup, a tree's
    alternatives), treated as one-hot by the verifier."""
    draft_s: float = 0.0
    """Seconds spent drafting."""
    draft_logits: torch.Tensor | None = None
    """[k, draft vocab] raw logits the tokens came from (model drafters only; a tree's chain
    only): what verify policies such as SV compare a companion against."""
    parents: tuple[int, ...] | None = None
    """A tree instead of a chain: parents[i] is the index of token i's parent (−1: the last
    committed token), always < i; None means a chain. A tree lists its chain first
    (tokens[:chain_length]); only a node's first child may carry a draft_probs row."""

    @property
    def k(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        """Tokens on the longest root-to-leaf path (k for a chain): the most one step can
        accept, and what draft lengths and acceptance by position count."""
        if self.parents is None:
            return self.k
        return max(tree_depths(self.parents), default=0)

    @property
    def chain_length(self) -> int:
        """How many leading tokens form a chain from the last committed token."""
        if self.parents is None:
            return self.k
        n = 0
        while n < self.k and self.parents[n] == n - 1:
            n += 1
        return n

    def truncated(self, n: int) -> Proposal:
        """The first n tokens (a prefix, or a subtree: both are safe to verify; docs/methods.md
        §1.2)."""
        probs = None if self.draft_probs is None else self.draft_probs[:n]
        logits = None if self.draft_logits is None else self.draft_logits[:n]
        parents = None if self.parents is None else self.parents[:n]
        return Proposal(self.tokens[:n], probs, self.draft_s, logits, parents)


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of verifying one proposal."""

    num_accepted: int
    next_token: int
    """The recovered token (after a rejection) or the bonus token (all accepted)."""
    path: tuple[int, ...] | None = None
    """For a tree: the accepted nodes, root to leaf (num_accepted of them); None for a chain."""

    @property
    def chain_accepted(self) -> int:
        """Accepted tokens of the proposal's leading chain (all of them for a chain)."""
        if self.path is None:
            return self.num_accepted
        n = 0
        while n < len(self.path) and self.path[n] == n:
            n += 1
        return n

    def emitted(self, proposal_tokens: list[int]) -> list[int]:
        accepted = (
            proposal_tokens[: self.num_accepted]
            if self.path is None
            else [proposal_tokens[i] for i in self.path]
        )
        return [*accepted, self.next_token]


@dataclass(frozen=True)
class StepRecord:
    """Metrics of one verify step, as observed by policies and aggregated into stats.

    Draft lengths count depth along a path, so chain and tree rows mean the same: for a chain
    each is a token count; a tree of depth d drafted d (its siblings are alternatives at a
    depth, not further tokens), and its accepted path has num_accepted nodes. What the target
    paid for is num_nodes."""

    num_drafted: int
    """Depth of the proposal as drafted."""
    num_verified: int
    """Depth of what the target verified (a verify policy or the context end may cut it)."""
    num_accepted: int
    """Depth of the accepted path."""
    num_emitted: int
    """Tokens actually appended (can be fewer than num_accepted + 1 at EOS or max length)."""
    draft_s: float
    verify_s: float
    context_len: int
    num_nodes: int
    """Drafted tokens fed to the target in the verify forward (num_verified for a chain, every
    node for a tree)."""
    policy_s: float = 0.0
    """Seconds a learned draft policy spent deciding (LTD), part of draft_s."""
    target_confidence: float | None = None
    """The target's top probability (T = 1) at the step's first verified position, where a
    planner reads it (the goodput controller forecasts acceptance from it); None elsewhere."""
