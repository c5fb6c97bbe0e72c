"""Monte-Carlo check of the real code path (docs/methods.md §6, kind 3).

The target here emits independent tokens: the token at output position t is distributed as
p[t] whatever came before (a valid autoregressive model), and the draft proposes position t from
q[t]. A speculative step that starts at position m drafts positions m..m+k-1 from q with the
seeded generator and calls the verifier with the target rows m..m+k. Over N trials the first
output token must follow p[0] (and the first two p[0] ⊗ p[1]); a chi-square goodness-of-fit test
must not reject. The same helper run on deliberately broken verifiers must reject, so the test
demonstrably can fail.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specpilot.config import SamplingConfig
from specpilot.sampling import logits_to_probs, sample
from specpilot.types import VerifyResult
from specpilot.verify.rules import residual_distribution, verify_sampling

Verifier = Callable[[list[int], "torch.Tensor | None", torch.Tensor, torch.Generator], VerifyResult]

N = 20_000
VOCAB = 6
ACCEPT_P = 1e-3  # a correct verifier must give a p-value above this
REJECT_P = 1e-6  # a broken one must give a p-value below this


def random_rows(rows: int, seed: int, sampling: SamplingConfig | None = None) -> torch.Tensor:
    """[rows, VOCAB] float64 distributions: logits_to_probs of random logits."""
    logits = torch.randn(
        rows, VOCAB, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    return logits_to_probs(logits, sampling or SamplingConfig(temperature=1.0))


def sample_output_prefix(
    verifier: Verifier,
    target_rows: torch.Tensor,
    draft: torch.Tensor | list[int],
    k: int,
    length: int,
    seed: int,
    n: int = N,
) -> np.ndarray:
    """Counts over VOCAB**length cells of the first `length` output tokens in n runs.

    target_rows: [positions + 1, ...] what the verifier gets, sliced per step (probs, or logits
    for `verify`). draft: [positions, VOCAB] q rows (drafts sampled from them with the
    generator), or a list of fixed proposals per position (deterministic draft, None q)."""
    generator = torch.Generator().manual_seed(seed)
    positions = length - 1 + k
    assert target_rows.shape[0] >= positions + 1
    deterministic = isinstance(draft, list)
    # Draft tokens for every step and position, drawn up front from the same generator:
    # tables[step][trial] lists proposals for all positions; a step starting at position m uses
    # entries m..m+k-1 of its own table (a step's proposals are independent of earlier steps).
    tables = []
    for _ in range(length):
        if deterministic:
            tables.append([draft[:positions]] * n)
        else:
            drawn = torch.multinomial(draft[:positions], n, replacement=True, generator=generator)
            tables.append(drawn.T.tolist())
    target_slices = [target_rows[m : m + k + 1] for m in range(length)]
    draft_slices = [None if deterministic else draft[m : m + k] for m in range(length)]
    counts = np.zeros(VOCAB**length, dtype=np.int64)
    for trial in range(n):
        out: list[int] = []
        step = 0
        while len(out) < length:
            m = len(out)
            tokens = tables[step][trial][m : m + k]
            result = verifier(tokens, draft_slices[m], target_slices[m], generator)
            out += tokens[: result.num_accepted] + [result.next_token]
            step += 1
        cell = 0
        for token in out[:length]:
            cell = cell * VOCAB + token
        counts[cell] += 1
    return counts


def expected_probs(target_rows: torch.Tensor, length: int) -> np.ndarray:
    """Independent tokens: the first `length` tokens are distributed as p[0] ⊗ ... ⊗ p[length-1]."""
    joint = np.ones(1)
    for t in range(length):
        joint = np.outer(joint, target_rows[t].numpy()).ravel()
    return joint


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Goodness-of-fit p-value of `counts` against `probs`; 0 if a zero-probability cell was hit
    (an impossible output is an infinitely bad fit)."""
    support = probs > 0
    if counts[~support].any():
        return 0.0
    expected = probs[support] / probs[support].sum() * counts.sum()
    return float(chisquare(counts[support], expected).pvalue)


def fit(
    verifier: Verifier,
    target_probs: torch.Tensor,
    draft,
    k: int,
    length: int = 1,
    seed: int = 0,
    verifier_rows: torch.Tensor | None = None,
) -> float:
    """p-value of the first `length` emitted tokens against the target's distribution
    (`verifier_rows`, e.g. logits, replace target_probs as the verifier's input when given)."""
    rows = target_probs if verifier_rows is None else verifier_rows
    counts = sample_output_prefix(verifier, rows, draft, k, length, seed)
    return chi_square_pvalue(counts, expected_probs(target_probs, length))


# --------------------------------------------------------------------------------------------
# Deliberately broken verifiers (the same random-number order as verify_sampling)


def broken_resample_from_p(draft_tokens, draft_probs, target_probs, generator) -> VerifyResult:
    """Wrong: after a rejection, samples the recovered token from p instead of the residual."""
    k = len(draft_tokens)
    uniforms = torch.rand(k, generator=generator, dtype=target_probs.dtype)
    for i, token in enumerate(draft_tokens):
        q = 1.0 if draft_probs is None else float(draft_probs[i, token])
        if uniforms[i] * q >= target_probs[i, token]:
            return VerifyResult(i, sample(target_probs[i], generator))
    return VerifyResult(k, sample(target_probs[k], generator))


def broken_accept_with_p(draft_tokens, draft_probs, target_probs, generator) -> VerifyResult:
    """Wrong: accepts with probability p(x) instead of min(1, p(x)/q(x))."""
    k = len(draft_tokens)
    uniforms = torch.rand(k, generator=generator, dtype=target_probs.dtype)
    for i, token in enumerate(draft_tokens):
        if uniforms[i] >= target_probs[i, token]:
            q_row = None if draft_probs is None else draft_probs[i]
            residual = residual_distribution(target_probs[i], q_row, token)
            return VerifyResult(i, sample(residual, generator))
    return VerifyResult(k, sample(target_probs[k], generator))


def broken_bonus_row(draft_tokens, draft_probs, target_probs, generator) -> VerifyResult:
    """Wrong: draws the bonus token from row k − 1 instead of row k (invisible in the first
    token, visible in the first two)."""
    wrong_rows = torch.cat([target_probs[:-1], target_probs[-2:-1]])
    return verify_sampling(draft_tokens, draft_probs, wrong_rows, generator)


# --------------------------------------------------------------------------------------------
# Tests. Each case is built once; the broken verifiers run on exactly the inputs and seed
# of a case the correct verifier passes.


def first_token_case() -> tuple[torch.Tensor, torch.Tensor, int]:
    """k = 2: target rows [3, VOCAB], draft rows [2, VOCAB], seed."""
    return random_rows(3, seed=1), random_rows(2, seed=101), 1


def two_token_case() -> tuple[torch.Tensor, torch.Tensor, int]:
    """k = 1, first two tokens: target rows [3, VOCAB], draft rows [2, VOCAB], seed."""
    return random_rows(3, seed=2), random_rows(2, seed=102), 2


def test_first_token_follows_target():
    """verify_sampling with k = 2 drafts sampled from q: the first emitted token follows p[0]."""
    target, draft, seed = first_token_case()
    assert fit(verify_sampling, target, draft, k=2, seed=seed) > ACCEPT_P


def test_first_token_follows_target_deterministic_draft():
    """Deterministic draft (draft_probs None, e.g. n-gram lookup): still exactly p[0]."""
    target, _, seed = first_token_case()
    assert fit(verify_sampling, target, [3, 1], k=2, seed=seed) > ACCEPT_P


def test_first_token_follows_filtered_target():
    """A top-k/top-p target (zeros in p) and a filtered draft (zeros in q), k = 3: the first
    token follows logits_to_probs(target_logits)[0] and never lands outside its support."""
    target = random_rows(4, seed=3, sampling=SamplingConfig(temperature=0.8, top_k=4, top_p=0.9))
    draft = random_rows(3, seed=103, sampling=SamplingConfig(temperature=1.0, top_k=3))
    assert (target[0] == 0).any() and (draft == 0).any()
    assert fit(verify_sampling, target, draft, k=3, seed=3) > ACCEPT_P


def test_first_two_tokens_follow_target():
    """k = 1: the second output token is the bonus (after acceptance) or the first token of the
    next step (after a rejection); the pair must follow p[0] ⊗ p[1]."""
    target, draft, seed = two_token_case()
    assert fit(verify_sampling, target, draft, k=1, length=2, seed=seed) > ACCEPT_P


@pytest.mark.parametrize("broken", [broken_resample_from_p, broken_accept_with_p])
def test_broken_verifier_is_rejected(broken):
    """The same helper, on the inputs and seed of test_first_token_follows_target, rejects a
    verifier with a classic mistake: so that test can fail."""
    target, draft, seed = first_token_case()
    assert fit(broken, target, draft, k=2, seed=seed) < REJECT_P


def test_broken_bonus_is_rejected():
    """A bonus drawn from the wrong row cannot change the first token (the bonus is never
    first), but the two-token check (inputs and seed of test_first_two_tokens_follow_target)
    rejects it."""
    target, draft, seed = two_token_case()
    assert fit(broken_bonus_row, target, draft, k=1, length=2, seed=seed) < REJECT_P
