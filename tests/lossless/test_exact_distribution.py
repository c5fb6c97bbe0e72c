"""Exact distribution by enumeration (docs/methods.md §6, kind 2).

The "models" are first-order Markov chains over a tiny vocabulary: the target is P[prev, next]
(float64) and the draft Q[prev, next] (or a deterministic proposal table, like n-gram lookup).
One speculative step from a context ending in token s drafts x_1..x_k with probability
Π Q[x_{i-1}, x_i]; the target rows are p_i = P[x_i] (x_0 = s). Position i is accepted with
probability min(1, p_i(x_{i+1}) / q_i(x_{i+1})) — the probability that the code's test
u·q < p passes for u ~ U[0, 1) — and the first rejection emits a token drawn from the code's own
`residual_distribution`; after k acceptances the bonus is drawn from p_k.

Enumerating every draft path gives the exact distribution of the block a step emits (1..k+1
tokens). Chaining steps (a step that emits m < L tokens is followed by another step from its last
token) gives the exact distribution of the first L output tokens, which must equal the target's
Π P[prev, next] to 1e-12 — for plain, temperature, top-k, top-p and greedy targets.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from functools import cache

import pytest
import torch

from specpilot.config import SamplingConfig
from specpilot.sampling import logits_to_probs
from specpilot.verify.rules import residual_distribution

Block = tuple[int, ...]
Residual = Callable[[torch.Tensor, torch.Tensor | None, int], torch.Tensor]
TOL = 1e-12


def markov_chain(vocab: int, seed: int, sampling: SamplingConfig | None = None) -> torch.Tensor:
    """[vocab, vocab] random transition matrix: row `prev` is the distribution of the next token,
    logits_to_probs(random logits, sampling) (plain softmax when sampling is None)."""
    logits = (
        torch.randn(
            vocab, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
        )
        * 1.5
    )
    return logits_to_probs(logits, sampling or SamplingConfig(temperature=1.0))


class Drafter:
    """A Markov-chain draft: Q[prev] when `draft` is a matrix, or the deterministic proposal
    `draft[prev]` (draft_probs None, i.e. a one-hot q) when it is a list of token ids."""

    def __init__(self, draft: torch.Tensor | list[int]):
        self.draft = draft

    @property
    def deterministic(self) -> bool:
        return isinstance(self.draft, list)

    def paths(self, start: int, k: int) -> list[tuple[Block, float]]:
        """Every draft path x_1..x_k from `start` with its probability Π Q (zero ones dropped)."""
        if self.deterministic:
            path, prev = [], start
            for _ in range(k):
                prev = self.draft[prev]
                path.append(prev)
            return [(tuple(path), 1.0)]
        out = []
        vocab = self.draft.shape[-1]
        for path in itertools.product(range(vocab), repeat=k):
            prob, prev = 1.0, start
            for token in path:
                prob *= float(self.draft[prev, token])
                prev = token
            if prob > 0:
                out.append((path, prob))
        return out

    def row(self, prev: int) -> torch.Tensor | None:
        """q for the token after `prev`: [vocab], or None for a deterministic proposal."""
        return None if self.deterministic else self.draft[prev]


def step_distribution(
    target: torch.Tensor,
    drafter: Drafter,
    start: int,
    k: int,
    residual: Residual = residual_distribution,
) -> dict[Block, float]:
    """Exact distribution of the block one speculative step emits from a context ending in
    `start`: accepted drafts followed by the recovered or bonus token."""
    blocks: dict[Block, float] = defaultdict(float)
    for path, path_prob in drafter.paths(start, k):
        reach = path_prob  # probability of drafting `path` and accepting path[:i]
        prev = start
        for i, token in enumerate(path):
            p, q_row = target[prev], drafter.row(prev)
            q = 1.0 if q_row is None else float(q_row[token])
            accept = min(1.0, float(p[token]) / q)
            if accept < 1.0:
                recovered = residual(p, q_row, token)
                for y, prob in enumerate(recovered.tolist()):
                    blocks[path[:i] + (y,)] += reach * (1.0 - accept) * prob
            reach *= accept
            prev = token
        for y, prob in enumerate(target[prev].tolist()):  # bonus after k acceptances
            blocks[path + (y,)] += reach * prob
    return dict(blocks)


def output_prefix_distribution(
    target: torch.Tensor,
    drafter: Drafter,
    start: int,
    length: int,
    k_of: Callable[[int], int],
    residual: Residual = residual_distribution,
) -> dict[Block, float]:
    """Exact distribution of the first `length` output tokens of speculative decoding from
    `start`, chaining steps; the step from context token s drafts k_of(s) tokens."""

    @cache
    def prefix(start: int, length: int) -> dict[Block, float]:
        out: dict[Block, float] = defaultdict(float)
        for block, prob in step_distribution(target, drafter, start, k_of(start), residual).items():
            if len(block) >= length:
                out[block[:length]] += prob
            else:
                for rest, rest_prob in prefix(block[-1], length - len(block)).items():
                    out[block + rest] += prob * rest_prob
        return dict(out)

    return prefix(start, length)


def target_prefix_distribution(target: torch.Tensor, start: int, length: int) -> dict[Block, float]:
    """The target's own distribution of the next `length` tokens: Π P[prev, next]."""
    vocab = target.shape[-1]
    out = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob, prev = 1.0, start
        for token in seq:
            prob *= float(target[prev, token])
            prev = token
        out[seq] = prob
    return out


def marginal(dist: dict[Block, float], length: int) -> dict[Block, float]:
    """Distribution of the first `length` tokens of sequences distributed as `dist`."""
    out: dict[Block, float] = defaultdict(float)
    for seq, prob in dist.items():
        out[seq[:length]] += prob
    return dict(out)


def max_error(got: dict[Block, float], expected: dict[Block, float]) -> float:
    keys = set(got) | set(expected)
    return max(abs(got.get(key, 0.0) - expected.get(key, 0.0)) for key in keys)


def assert_lossless(
    target: torch.Tensor, drafter: Drafter, k_of: Callable[[int], int], max_length: int = 3
) -> None:
    """For every start token and output lengths 1..max_length, the speculative distribution
    equals the target's to TOL; every single step's block distribution sums to 1."""
    vocab = target.shape[-1]
    for start in range(vocab):
        step = step_distribution(target, drafter, start, k_of(start))
        assert sum(step.values()) == pytest.approx(1.0, abs=TOL)
        assert all(1 <= len(block) <= k_of(start) + 1 for block in step)
        longest = output_prefix_distribution(target, drafter, start, max_length, k_of)
        for length in range(1, max_length + 1):  # the first token, the first two, ...
            got = marginal(longest, length)
            expected = target_prefix_distribution(target, start, length)
            assert max_error(got, expected) < TOL, (start, length)


TARGETS = {
    "softmax": None,
    "temperature": SamplingConfig(temperature=0.6),
    "top_k": SamplingConfig(temperature=1.0, top_k=2),
    "top_p": SamplingConfig(temperature=0.9, top_p=0.7),
    "top_k_top_p": SamplingConfig(temperature=1.3, top_k=3, top_p=0.8),
    "greedy": SamplingConfig(temperature=0.0),
}


@pytest.mark.parametrize("vocab", [3, 4])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("target_kind", list(TARGETS))
def test_sampled_draft_is_lossless(target_kind, k, vocab):
    """Draft tokens sampled from a different Markov chain Q (full support): the first 1..3 output
    tokens are distributed exactly as the target's."""
    target = markov_chain(vocab, seed=10 * k + vocab, sampling=TARGETS[target_kind])
    drafter = Drafter(markov_chain(vocab, seed=100 + 10 * k + vocab))
    assert_lossless(target, drafter, lambda _: k)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("target_kind", ["softmax", "top_k", "top_p"])
def test_filtered_draft_is_lossless(target_kind, k):
    """A draft with zeros (top-k/top-p filtered Q) where the target has mass, and vice versa:
    the residual must supply the tokens the draft can never propose."""
    vocab = 4
    target = markov_chain(vocab, seed=20 + k, sampling=TARGETS[target_kind])
    draft = markov_chain(vocab, seed=200 + k, sampling=SamplingConfig(0.8, top_k=2, top_p=0.9))
    assert_lossless(target, Drafter(draft), lambda _: k)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_draft_equal_to_target_is_lossless(k):
    """Q == P: everything is accepted (each step emits k + 1 tokens), still exact."""
    target = markov_chain(3, seed=30 + k)
    assert_lossless(target, Drafter(target.clone()), lambda _: k)
    step = step_distribution(target, Drafter(target.clone()), 0, k)
    assert sum(prob for block, prob in step.items() if len(block) == k + 1) == pytest.approx(1.0)


@pytest.mark.parametrize("vocab", [3, 4])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("target_kind", list(TARGETS))
def test_deterministic_draft_is_lossless(target_kind, k, vocab):
    """draft_probs None (greedy drafting, n-gram lookup): a fixed proposal table next[prev],
    treated as a one-hot q, is exact too."""
    target = markov_chain(vocab, seed=40 + 10 * k + vocab, sampling=TARGETS[target_kind])
    proposals = torch.randint(vocab, (vocab,), generator=torch.Generator().manual_seed(k)).tolist()
    assert_lossless(target, Drafter(proposals), lambda _: k)


@pytest.mark.parametrize("deterministic", [False, True])
def test_context_dependent_k_is_lossless(deterministic):
    """k chosen from the context (as an adaptive policy does), here k = 1 + prev % 3, changes
    how many tokens each step drafts but not the output distribution."""
    vocab = 4
    target = markov_chain(vocab, seed=50, sampling=TARGETS["top_p"])
    draft = [3, 0, 0, 2] if deterministic else markov_chain(vocab, seed=51)
    assert_lossless(target, Drafter(draft), lambda prev: 1 + prev % 3, max_length=4)


def test_enumeration_detects_a_wrong_residual():
    """The check can fail: emitting a fresh sample of p after a rejection (instead of
    norm(max(p − q, 0))) biases the output far beyond TOL."""
    vocab = 4
    target = markov_chain(vocab, seed=60)
    drafter = Drafter(markov_chain(vocab, seed=61))

    def wrong_residual(p, q, token):
        return p

    for length in (1, 2):
        got = output_prefix_distribution(target, drafter, 0, length, lambda _: 2, wrong_residual)
        assert max_error(got, target_prefix_distribution(target, 0, length)) > 1e-3
