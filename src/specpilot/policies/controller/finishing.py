"""Steps a row needs to finish, read where the slowest of a batch's rows falls (docs/methods.md
§7.5): the statistics plans that finish a batch soonest rest on."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

from specpilot.policies.controller.acceptance import FINISH_POOLING


def finishing_steps(
    forecast: Sequence[float], tested: Sequence[float] | None, remaining: float, z: float
) -> list[float]:
    """Steps a row needs to emit `remaining` tokens with each budget 0..len(forecast), read at
    the standard normal quantile z of their spread, not their mean: a batch waits for its
    slowest row, and the most steps of B rows exceeds the most of their expected steps. With
    m = 1 + E[N | k] tokens a step, S = R / m + z·sd, sd² = R·Var[N | k] / m³ (the outcomes
    still to come: tokens a step vary, so steps to R do) + (R / m²)²·Var(m) (the forecast's own
    uncertainty: each a_i known as from FINISH_POOLING + n_i + 1 verified positions, n_i the
    row's own count there, `tested`; None: the forecast is exact). Both terms count: rows known
    from many steps, read at their mean, drafted where the batch as a whole lost."""
    steps = [float(remaining)]
    expected = second = 0.0  # E[N], E[N²]
    reach = 1.0  # P(N ≥ n)
    slopes: list[float] = []  # ∂E[N]/∂a_i for i ≤ k
    for n, a in enumerate(forecast, start=1):
        reach *= a
        expected += reach
        second += (2 * n - 1) * reach
        slopes = [slope + reach / max(b, 1e-12) for slope, b in zip(slopes, forecast, strict=False)]
        slopes.append(reach / max(a, 1e-12))
        m = 1.0 + expected
        spread = remaining * max(second - expected * expected, 0.0) / m**3
        if tested is not None:
            uncertain = sum(
                (slope * slope) * b * (1.0 - b) / (FINISH_POOLING + count + 1.0)
                for slope, b, count in zip(slopes, forecast, tested, strict=False)
            )
            spread += (remaining / (m * m)) ** 2 * uncertain
        steps.append(remaining / m + z * math.sqrt(spread))
    return steps


def finishing_quantile(rows: int) -> float:
    """z at B / (B + 1) for B rows (about where the most of B draws falls); 0 for one row."""
    return NormalDist().inv_cdf(rows / (rows + 1))
