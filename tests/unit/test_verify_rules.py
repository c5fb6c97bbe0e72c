"""Verifier tables (docs/methods.md §6, kind 1).

Hand-written cases pin down the greedy and sampling rules on inputs whose answer is obvious, and
the fast verifier in `verify.rules` is checked against the loop-based `verify.reference` on many
random inputs with equally seeded generators (both draw k uniforms, then at most one token).
"""

from __future__ import annotations

import pytest
import torch

from specpilot.config import SamplingConfig
from specpilot.sampling import logits_to_probs
from specpilot.types import VerifyResult
from specpilot.verify.reference import reference_verify_greedy, reference_verify_sampling
from specpilot.verify.rules import residual_distribution, verify, verify_greedy, verify_sampling

SEEDS = range(50)


def logits_with_argmax(argmaxes: list[int], vocab: int = 8, seed: int = 0) -> torch.Tensor:
    """[len(argmaxes), vocab] random logits whose row i has its maximum at argmaxes[i]."""
    logits = torch.randn(len(argmaxes), vocab, generator=torch.Generator().manual_seed(seed))
    logits[torch.arange(len(argmaxes)), argmaxes] = 10.0
    return logits


def one_hot(tokens: list[int], vocab: int, dtype=torch.float64) -> torch.Tensor:
    """[len(tokens), vocab] one-hot rows."""
    return torch.nn.functional.one_hot(torch.tensor(tokens, dtype=torch.long), vocab).to(dtype)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_probs(rows: int, vocab: int, g: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """[rows, vocab] random distributions, some peaked, some with exact zeros (top-k-like)."""
    scale = float(torch.rand((), generator=g, dtype=torch.float64)) * 4
    logits = torch.randn(rows, vocab, generator=g, dtype=torch.float64) * scale
    if torch.rand((), generator=g) < 0.3:  # zero out part of the vocabulary, like top-k
        keep = max(1, vocab // 3)
        kth = torch.topk(logits, keep, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits.softmax(-1).to(dtype)


# --------------------------------------------------------------------------------------------
# Greedy rule


@pytest.mark.parametrize(
    ("draft", "argmaxes", "expected"),
    [
        ([1, 2, 3], [1, 2, 3, 4], (3, 4)),  # all accepted: bonus = argmax of row k
        ([1, 2, 3], [0, 2, 3, 4], (0, 0)),  # mismatch at 0: recovered = argmax of row 0
        ([1, 2, 3], [1, 0, 3, 4], (1, 0)),  # mismatch at 1 (later rows agree, but are ignored)
        ([1, 2, 3], [1, 2, 5, 4], (2, 5)),  # mismatch at the last drafted position
        ([], [6], (0, 6)),  # k = 0: plain greedy decoding of one token
        ([7], [7, 7], (1, 7)),  # repeated token
    ],
)
def test_greedy_table(draft, argmaxes, expected):
    """Greedy accepts the longest prefix equal to the target's argmaxes, then emits argmax of
    the first disagreeing row (recovered) or of row k (bonus)."""
    logits = logits_with_argmax(argmaxes)
    assert verify_greedy(draft, logits) == VerifyResult(*expected)
    assert reference_verify_greedy(draft, logits) == VerifyResult(*expected)
    greedy = SamplingConfig(temperature=0.0)
    assert verify(draft, None, logits, greedy, None) == VerifyResult(*expected)


@pytest.mark.parametrize("draft_probs_given", [False, True])
def test_sampling_rule_with_one_hot_target_is_the_greedy_rule(draft_probs_given):
    """With a greedy target (p = one-hot argmax) the sampling verifier reduces to the greedy
    rule for every seed and any draft distribution, so greedy is the T → 0 limit of sampling."""
    g = gen(123)
    for trial in range(100):
        k = trial % 5
        vocab = 6
        logits = torch.randn(k + 1, vocab, generator=g, dtype=torch.float64)
        target_probs = logits_to_probs(logits, SamplingConfig(temperature=0.0))
        draft_probs = random_probs(k, vocab, g) if draft_probs_given else None
        if draft_probs is None:
            draft = torch.randint(vocab, (k,), generator=g).tolist()
        else:
            draft = [int(torch.multinomial(row, 1, generator=g)) for row in draft_probs]
        # Make some drafts right for a prefix so that both outcomes occur.
        argmax = logits.argmax(-1).tolist()
        agree = int(torch.randint(k + 1, (), generator=g))
        for i in range(agree):
            if draft_probs is None or draft_probs[i, argmax[i]] > 0:
                draft[i] = argmax[i]
        expected = verify_greedy(draft, logits)
        assert verify_sampling(draft, draft_probs, target_probs, gen(trial)) == expected


# --------------------------------------------------------------------------------------------
# Sampling rule, degenerate distributions


@pytest.mark.parametrize("k", [0, 1, 4])
def test_sampling_p_equals_q_always_accepts(k):
    """p == q at every drafted position: min(1, p/q) = 1, so every draft is accepted, and the
    bonus is drawn from row k (here one-hot at token 2, so it is exactly 2)."""
    vocab = 5
    g = gen(7)
    probs = random_probs(k, vocab, g)
    target_probs = torch.cat([probs, one_hot([2], vocab)])
    for seed in SEEDS:
        draft = [int(torch.multinomial(row, 1, generator=g)) for row in probs]
        result = verify_sampling(draft, probs, target_probs, gen(seed))
        assert result == VerifyResult(k, 2)


@pytest.mark.parametrize("draft_probs_given", [False, True])
def test_sampling_zero_target_mass_always_rejects(draft_probs_given):
    """If p gives zero mass to the drafted token at position j (and p == q before it), the
    verifier accepts exactly j tokens and the recovered token is never the drafted one."""
    vocab = 6
    g = gen(11)
    for j in range(4):
        k = 4
        draft_probs = random_probs(k, vocab, g)
        draft = [int(torch.multinomial(row, 1, generator=g)) for row in draft_probs]
        target_probs = torch.cat([draft_probs, random_probs(1, vocab, g)]).clone()
        target_probs[j] = random_probs(1, vocab, g)[0]
        target_probs[j, draft[j]] = 0.0
        target_probs[j] /= target_probs[j].sum()
        if not draft_probs_given:  # one-hot q: p == q before j needs p one-hot on the draft
            target_probs[:j] = one_hot(draft[:j], vocab)
        for seed in SEEDS:
            q = draft_probs if draft_probs_given else None
            result = verify_sampling(draft, q, target_probs, gen(seed))
            assert result.num_accepted == j
            assert result.next_token != draft[j]
            assert target_probs[j, result.next_token] > 0


def test_deterministic_draft_is_one_hot_q():
    """draft_probs None (greedy drafting, n-gram lookup) is exactly the one-hot q: the same
    residual, and the same result with the same seed."""
    g = gen(5)
    for trial in range(200):
        k = trial % 6
        vocab = 4 + trial % 7
        target_probs = random_probs(k + 1, vocab, g)
        draft = torch.randint(vocab, (k,), generator=g).tolist()
        q = one_hot(draft, vocab)
        fast_none = verify_sampling(draft, None, target_probs, gen(trial))
        fast_one_hot = verify_sampling(draft, q, target_probs, gen(trial))
        assert fast_none == fast_one_hot
        for i in range(k):
            assert torch.equal(
                residual_distribution(target_probs[i], None, draft[i]),
                residual_distribution(target_probs[i], q[i], draft[i]),
            )


@pytest.mark.parametrize(
    ("p", "q", "token", "expected"),
    [
        ([0.4, 0.4, 0.2], [0.1, 0.3, 0.6], 2, [0.75, 0.25, 0.0]),  # norm(max(p - q, 0))
        ([0.5, 0.3, 0.2], [0.2, 0.5, 0.3], 1, [1.0, 0.0, 0.0]),
        ([0.2, 0.3, 0.5], None, 2, [0.4, 0.6, 0.0]),  # one-hot q: p without the rejected token
        ([0.3, 0.3, 0.4], [0.3, 0.3, 0.4], 0, [0.3, 0.3, 0.4]),  # p == q: fall back to p
    ],
)
def test_residual_table(p, q, token, expected):
    """The residual is norm(max(p − q, 0)); with a deterministic draft it is p with the rejected
    token removed; when p == q (rejection had probability 0) it falls back to p."""
    p = torch.tensor(p, dtype=torch.float64)
    q = None if q is None else torch.tensor(q, dtype=torch.float64)
    got = residual_distribution(p, q, token)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))
    assert got.dtype == torch.float64


# --------------------------------------------------------------------------------------------
# Fast verifier == slow reference


def random_case(g: torch.Generator, draft_probs_given: bool, dtype=torch.float64):
    """Random (draft, draft_probs, target_probs): k in 0..6, vocab 5..50; drafts drawn from q.
    Some positions get p == q (sure acceptance) or p(x) = 0 (sure rejection)."""
    k = int(torch.randint(0, 7, (), generator=g))
    vocab = int(torch.randint(5, 51, (), generator=g))
    target_probs = random_probs(k + 1, vocab, g, dtype)
    if draft_probs_given:
        draft_probs = random_probs(k, vocab, g, dtype)
        for i in range(k):
            if torch.rand((), generator=g) < 0.2:
                target_probs[i] = draft_probs[i]
        draft = [int(torch.multinomial(row, 1, generator=g)) for row in draft_probs]
    else:
        draft_probs = None
        draft = torch.randint(vocab, (k,), generator=g).tolist()
        for i in range(k):  # make the draft likely under p at some positions
            if torch.rand((), generator=g) < 0.3:
                draft[i] = int(target_probs[i].argmax())
    return draft, draft_probs, target_probs


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("draft_probs_given", [False, True])
def test_fast_sampling_equals_reference(draft_probs_given, dtype):
    """Same seed, same inputs → the fast verifier returns exactly what the loop reference does,
    and leaves both generators in the same state (it draws the same random numbers)."""
    g = gen(2024 + int(draft_probs_given))
    outcomes = set()
    for trial in range(400):
        draft, draft_probs, target_probs = random_case(g, draft_probs_given, dtype)
        fast_gen, ref_gen = gen(trial), gen(trial)
        fast = verify_sampling(draft, draft_probs, target_probs, fast_gen)
        ref = reference_verify_sampling(draft, draft_probs, target_probs, ref_gen)
        assert fast == ref, (trial, draft)
        assert torch.equal(fast_gen.get_state(), ref_gen.get_state())
        outcomes.add(fast.num_accepted == len(draft))
    assert outcomes == {True, False}  # both full acceptance and rejections were exercised


def test_fast_greedy_equals_reference():
    """verify_greedy equals the loop reference on random logits with partly right drafts."""
    g = gen(99)
    for _ in range(500):
        k = int(torch.randint(0, 7, (), generator=g))
        vocab = int(torch.randint(5, 51, (), generator=g))
        logits = torch.randn(k + 1, vocab, generator=g)
        draft = logits[:k].argmax(-1).tolist()
        if k and torch.rand((), generator=g) < 0.7:
            j = int(torch.randint(k, (), generator=g))
            draft[j] = int(torch.randint(vocab, (), generator=g))
        assert verify_greedy(draft, logits) == reference_verify_greedy(draft, logits)


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=0.7, top_k=3),
        SamplingConfig(temperature=1.3, top_p=0.8),
    ],
)
def test_verify_dispatches_sampling_through_logits_to_probs(sampling):
    """`verify` with a sampling config is `verify_sampling` on logits_to_probs(target_logits)."""
    g = gen(3)
    for trial in range(50):
        k, vocab = trial % 5, 9
        logits = torch.randn(k + 1, vocab, generator=g, dtype=torch.float64)
        draft_probs = random_probs(k, vocab, g)
        draft = [int(torch.multinomial(row, 1, generator=g)) for row in draft_probs]
        expected = verify_sampling(
            draft, draft_probs, logits_to_probs(logits, sampling), gen(trial)
        )
        assert verify(draft, draft_probs, logits, sampling, gen(trial)) == expected
