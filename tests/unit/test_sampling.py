"""logits → probabilities (temperature, top-k, top-p), token choice, entropy, SamplingConfig.

The verifier is only lossless against the distribution `logits_to_probs` returns, so these tests
pin down that distribution: the greedy one-hot, softmax(logits / T), the top-k and top-p filters
(top-k first, then top-p on what is left), normalisation and dtype.
"""

from __future__ import annotations

import math

import pytest
import torch

from specpilot.config import SamplingConfig
from specpilot.errors import ConfigError
from specpilot.sampling import choose_token, entropy, logits_to_probs


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def probs_to_logits(probs: list[float], dtype=torch.float64) -> torch.Tensor:
    """Logits whose softmax (at temperature 1) is `probs`."""
    return torch.tensor(probs, dtype=dtype).log()


def kept(probs: torch.Tensor) -> list[int]:
    """Indices of tokens with non-zero probability."""
    return torch.nonzero(probs > 0).flatten().tolist()


def reference_filter(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Loop reference for one [vocab] row: temperature, keep the top_k tokens, then the smallest
    prefix of the remaining tokens (sorted by probability) whose mass reaches top_p."""
    probs = (logits / sampling.temperature).softmax(-1)
    order = torch.argsort(probs, descending=True).tolist()
    if sampling.top_k:
        order = order[: sampling.top_k]
    mass = sum(float(probs[i]) for i in order)
    chosen, total = [], 0.0
    for i in order:
        chosen.append(i)
        total += float(probs[i]) / mass
        if total >= sampling.top_p:
            break
    out = torch.zeros_like(probs)
    out[chosen] = probs[chosen]
    return out / out.sum()


# --------------------------------------------------------------------------------------------
# logits_to_probs


def test_greedy_is_one_hot_argmax():
    """temperature 0 gives the one-hot of the argmax, row by row, for any leading shape."""
    logits = torch.randn(2, 3, 11, generator=gen(0))
    probs = logits_to_probs(logits, SamplingConfig(temperature=0.0))
    assert probs.shape == logits.shape
    expected = torch.nn.functional.one_hot(logits.argmax(-1), 11).float()
    assert torch.equal(probs, expected)


@pytest.mark.parametrize("temperature", [0.25, 0.7, 1.0, 2.0, 10.0])
def test_temperature_scales_logits(temperature):
    """Without filters the distribution is softmax(logits / T)."""
    logits = torch.randn(4, 13, generator=gen(1), dtype=torch.float64)
    probs = logits_to_probs(logits, SamplingConfig(temperature=temperature))
    torch.testing.assert_close(probs, (logits / temperature).softmax(-1), rtol=0, atol=1e-15)


@pytest.mark.parametrize("top_k", [1, 2, 5, 12])
def test_top_k_keeps_exactly_k(top_k):
    """top-k keeps exactly the k largest logits (no ties here), renormalised in proportion."""
    logits = torch.randn(6, 12, generator=gen(2), dtype=torch.float64)
    probs = logits_to_probs(logits, SamplingConfig(temperature=0.8, top_k=top_k))
    for row_logits, row in zip(logits, probs, strict=True):
        top = torch.topk(row_logits, top_k).indices.sort().values.tolist()
        assert kept(row) == top
        expected = (row_logits[top] / 0.8).softmax(-1)
        torch.testing.assert_close(row[top], expected, rtol=0, atol=1e-15)


def test_top_k_zero_or_at_least_vocab_keeps_everything():
    """top_k = 0 (off) and top_k >= vocab do not filter."""
    logits = torch.randn(3, 7, generator=gen(3), dtype=torch.float64)
    full = logits.softmax(-1)
    for top_k in (0, 7, 100):
        probs = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_k=top_k))
        torch.testing.assert_close(probs, full, rtol=0, atol=1e-15)


def test_top_k_keeps_ties_at_the_cutoff():
    """Tokens tied with the k-th largest logit are all kept (no arbitrary tie-break), so the
    result does not depend on the order of the vocabulary."""
    probs = logits_to_probs(torch.tensor([3.0, 1.0, 1.0, 0.0]), SamplingConfig(1.0, top_k=2))
    assert kept(probs) == [0, 1, 2]


@pytest.mark.parametrize(
    ("top_p", "expected_kept"),
    [
        (0.3, [0]),  # the top token always stays
        (0.49, [0]),
        (0.51, [0, 1]),
        (0.79, [0, 1]),  # 0.5 + 0.3 = 0.8 reaches 0.79
        (0.81, [0, 1, 2]),  # 0.8 does not reach 0.81: the 0.15 token is needed
        (0.94, [0, 1, 2]),
        (0.96, [0, 1, 2, 3]),
        (1.0, [0, 1, 2, 3]),
    ],
)
def test_top_p_hand_example(top_p, expected_kept):
    """probs [0.5, 0.3, 0.15, 0.05]: top-p keeps the smallest prefix of the sorted tokens whose
    mass reaches p, and renormalises it. (Exactly p = 0.8 is a rounding tie: softmax gives
    0.29999999999999993 for the second token, so the boundary cases stay off the table.)"""
    base = [0.5, 0.3, 0.15, 0.05]
    for perm in ([0, 1, 2, 3], [3, 1, 0, 2]):  # the filter must not depend on token order
        logits = probs_to_logits([base[i] for i in perm])
        probs = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=top_p))
        assert sorted(perm[i] for i in kept(probs)) == expected_kept
        mass = sum(base[i] for i in expected_kept)
        expected = [base[i] / mass if i in expected_kept else 0.0 for i in perm]
        torch.testing.assert_close(probs, torch.tensor(expected, dtype=torch.float64))


def test_top_k_is_applied_before_top_p():
    """top-p acts on the top-k renormalised distribution: [0.4, 0.3, 0.2, 0.1] with top_k = 2
    becomes [4/7, 3/7], where 4/7 already reaches 0.5, so top_p = 0.5 keeps one token (on the
    unfiltered distribution it would keep two)."""
    logits = probs_to_logits([0.4, 0.3, 0.2, 0.1])
    assert kept(logits_to_probs(logits, SamplingConfig(1.0, top_k=2, top_p=0.5))) == [0]
    assert kept(logits_to_probs(logits, SamplingConfig(1.0, top_p=0.5))) == [0, 1]


def test_filters_match_loop_reference():
    """Random logits, temperatures, top-k and top-p: equal to the loop reference (cases whose
    cumulative mass lies within 1e-9 of top_p are skipped: there the answer is a rounding tie)."""
    g = gen(4)
    checked = 0
    for _ in range(300):
        vocab = int(torch.randint(2, 40, (), generator=g))
        logits = torch.randn(vocab, generator=g, dtype=torch.float64) * 3
        sampling = SamplingConfig(
            temperature=float(torch.empty(()).uniform_(0.2, 2.0, generator=g)),
            top_k=int(torch.randint(0, vocab + 2, (), generator=g)),
            top_p=float(torch.empty(()).uniform_(0.05, 1.0, generator=g)),
        )
        expected = reference_filter(logits, sampling)
        sorted_probs = expected.sort(descending=True).values
        scaled = (logits / sampling.temperature).softmax(-1).sort(descending=True).values
        if sampling.top_k:
            scaled = scaled[: sampling.top_k] / scaled[: sampling.top_k].sum()
        if (scaled.cumsum(-1) - sampling.top_p).abs().min() < 1e-9:
            continue
        got = logits_to_probs(logits, sampling)
        assert kept(got) == kept(expected)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
        assert sorted_probs[0] > 0
        checked += 1
    assert checked > 250


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(0.0),
        SamplingConfig(1.0),
        SamplingConfig(0.5, top_k=3),
        SamplingConfig(1.5, top_p=0.6),
        SamplingConfig(0.9, top_k=5, top_p=0.9),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_probs_sum_to_one_and_dtype(sampling, dtype):
    """Every row is a distribution; float64 stays float64, anything narrower becomes float32."""
    logits = (torch.randn(3, 5, 17, generator=gen(5)) * 4).to(dtype)
    probs = logits_to_probs(logits, sampling)
    assert probs.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert probs.shape == logits.shape
    assert (probs >= 0).all()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 5, dtype=probs.dtype), rtol=0, atol=tol)


# --------------------------------------------------------------------------------------------
# choose_token, entropy


def test_choose_token_greedy_and_top_k_one_are_argmax():
    """Greedy and top_k = 1 both give the argmax, whatever the generator."""
    logits = torch.randn(20, generator=gen(6))
    best = int(logits.argmax())
    assert choose_token(logits, SamplingConfig(0.0), None) == best
    for seed in range(20):
        assert choose_token(logits, SamplingConfig(1.0, top_k=1), gen(seed)) == best


def test_choose_token_is_seeded_and_stays_in_support():
    """Same seed → same token; sampled tokens lie inside the top-k support."""
    logits = torch.randn(30, generator=gen(7))
    sampling = SamplingConfig(1.2, top_k=4)
    support = set(torch.topk(logits, 4).indices.tolist())
    tokens = [choose_token(logits, sampling, gen(seed)) for seed in range(200)]
    assert tokens == [choose_token(logits, sampling, gen(seed)) for seed in range(200)]
    assert set(tokens) <= support
    assert len(set(tokens)) > 1


def test_entropy():
    """Entropy (nats) of softmax(logits): log V for uniform logits, ~0 for a spike, and equal to
    −Σ p log p otherwise (temperature 1, no filtering)."""
    assert entropy(torch.zeros(8)).item() == pytest.approx(math.log(8))
    assert entropy(torch.tensor([100.0, 0.0, 0.0])).item() == pytest.approx(0.0, abs=1e-30)
    logits = torch.randn(4, 9, generator=gen(8), dtype=torch.float64)
    p = logits.softmax(-1)
    torch.testing.assert_close(entropy(logits), -(p * p.log()).sum(-1))


# --------------------------------------------------------------------------------------------
# SamplingConfig validation


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": -1.0},
        {"temperature": 1.0, "top_p": 0.0},
        {"temperature": 1.0, "top_p": -0.5},
        {"temperature": 1.0, "top_p": 1.01},
        {"temperature": 1.0, "top_k": -1},
    ],
)
def test_sampling_config_rejects_bad_values(kwargs):
    """Out-of-range values raise ConfigError (a ValueError) when the config is built."""
    with pytest.raises(ConfigError):
        SamplingConfig(**kwargs)


def test_sampling_config_accepts_edges():
    """temperature 0 (greedy), top_p 1 and top_k 0 (filters off) are valid."""
    assert SamplingConfig().greedy
    assert SamplingConfig(temperature=0.0, top_k=0, top_p=1.0).greedy
    assert not SamplingConfig(temperature=1e-3, top_k=1, top_p=1e-6).greedy
