"""SV's verification length: verify as many drafts as maximise goodput (SV paper §5;
docs/methods.md §4.2, §4.4).

Given per-position acceptance probabilities p_i (from `AcceptanceTable.lookup`) and conditional
independence, verifying the first γ drafted tokens yields E[N | γ] = Σ_{n≤γ} Π_{i≤n} p_i accepted
tokens, plus the target's own correction/bonus token. Verifying costs T(γ + 1) (the pending token
plus γ drafts). Goodput is tokens per second of verification; drafting and companion costs are
sunk (already paid, and overlapped with verification), so they are not in the denominator.
Truncating a draft never changes the output distribution, so any choice here is lossless.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Sequence

from specpilot.config import require

Latency = Callable[[int], float]
"""T(n): seconds to verify n fed tokens (a `VerifyLatency`, or any callable)."""


def _probabilities(p: Sequence[float], name: str = "p") -> list[float]:
    values = [float(x) for x in p]
    require(
        all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in values),
        f"{name} must be acceptance probabilities in [0, 1], got {values}",
    )
    return values


def _seconds(latency: Latency, n: int) -> float:
    """T(n), checked: a non-positive latency would make goodput meaningless."""
    t = float(latency(n))
    require(math.isfinite(t) and t > 0, f"verify latency T({n}) must be > 0 seconds, got {t}")
    return t


def expected_accepted(p: Sequence[float], gamma: int) -> float:
    """E[N | γ] = Σ_{n=1..γ} Π_{i≤n} p_i: expected accepted drafts when verifying the first γ,
    without the +1 correction/bonus token (a rejection at i ends the run)."""
    probs = _probabilities(p)
    require(0 <= gamma <= len(probs), f"gamma must be in 0..{len(probs)}, got {gamma}")
    total, prefix = 0.0, 1.0
    for x in probs[:gamma]:
        prefix *= x
        total += prefix
    return total


def goodput(p: Sequence[float], gamma: int, latency: Latency, plus_one: bool = True) -> float:
    """G(γ) = (E[N | γ] + 1) / T(γ + 1), tokens per second; without the +1 if `plus_one` is off."""
    bonus = 1.0 if plus_one else 0.0
    return (expected_accepted(p, gamma) + bonus) / _seconds(latency, gamma + 1)


def choose_length(
    p: Sequence[float],
    latency: Latency,
    plus_one: bool = True,
    realized: Sequence[float] | None = None,
) -> int:
    """Single request: the first local maximum of G(γ) walking up from γ = 0 (the paper's rule;
    G is concave when T is, so that is the maximum). Starting at 0 lets SV fall back to plain
    target decoding when the drafts look hopeless.

    `p` is what the decision to add position γ+1 may use for that position; `realized` (default
    `p`) is what positions already added count for. SV passes a forecast that does not look at
    the drafted token itself as `p` under sampling (see policies/sv.py for why).

    With `plus_one` off (the paper's possible formula), G(0) = 0, so γ = 1 wins whenever p_1 > 0:
    the walk then effectively starts at the paper's γ = 1.
    """
    return allocate_batch([p], latency, [realized] if realized is not None else None, plus_one)[0]


def allocate_batch(
    p_rows: Sequence[Sequence[float]],
    latency: Latency,
    realized_rows: Sequence[Sequence[float]] | None = None,
    plus_one: bool = True,
) -> list[int]:
    """Per-request verification lengths for one batched target pass (SV paper §5; docs/methods.md
    §4.4).

    Every row verifies its pending token (E_tot = B tokens, n_tot = B fed). Greedily give one more
    drafted position to the row with the largest marginal gain Π_{i≤γ_q} r_{q,i} · p_{q,γ_q+1}
    while that raises the batch goodput E_tot / T(n_tot), where r are the realized values
    (`realized_rows`, default p) of positions already given (`marginal_order`). Stops at the
    first non-improving step (T is a step function under GPU tiling, so this can stop early; no
    lookahead). A row never exceeds len(p_row).
    `plus_one` off drops each row's own token from E_tot (the paper's possible formula).
    """
    rows = [_probabilities(row, f"p_rows[{q}]") for q, row in enumerate(p_rows)]
    if realized_rows is None:
        realized = rows
    else:
        realized = [_probabilities(r, f"realized_rows[{q}]") for q, r in enumerate(realized_rows)]
        require(
            [len(r) for r in realized] == [len(r) for r in rows],
            "realized_rows must have the shape of p_rows",
        )
    gammas = [0] * len(rows)
    expected, fed = float(len(rows)) if plus_one else 0.0, len(rows)
    seconds = _seconds(latency, fed) if rows else 0.0
    for q, gain, realized_gain in marginal_order(rows, realized):
        next_seconds = _seconds(latency, fed + 1)
        if (expected + gain) / next_seconds <= expected / seconds:
            break
        gammas[q] += 1
        expected, fed, seconds = expected + realized_gain, fed + 1, next_seconds
    return gammas


def marginal_order(
    p_rows: Sequence[Sequence[float]], realized_rows: Sequence[Sequence[float]] | None = None
) -> Iterator[tuple[int, float, float]]:
    """Drafted positions in the greedy order of their expected gain: (row, gain, realized gain)
    where gain = Π_{i<γ} r_{q,i} · p_{q,γ} is what adding row q's next position γ adds to the
    expected accepted tokens (realized gain: the same with r_{q,γ}). With r = p a row's gains
    only shrink, so the first n items are the n positions that maximise the expected accepted
    tokens, each row's a prefix. A max-heap (ties: lowest row) makes it O(B·γ·log B)."""
    realized = p_rows if realized_rows is None else realized_rows
    prefixes = [1.0] * len(p_rows)
    heap = [(-row[0], q, 0) for q, row in enumerate(p_rows) if len(row)]
    heapq.heapify(heap)
    while heap:
        gain, q, gamma = heapq.heappop(heap)
        prefixes[q] *= realized[q][gamma]
        yield q, -gain, prefixes[q]
        if gamma + 1 < len(p_rows[q]):
            heapq.heappush(heap, (-prefixes[q] * p_rows[q][gamma + 1], q, gamma + 1))
