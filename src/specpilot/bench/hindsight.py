"""Hindsight ceilings: the best decoding rate any chooser could reach knowing every outcome.

An adaptive method (LTD's tree shape, SVIP's draft length, SV's verify length, the goodput
controller's k) picks one of a few choices per draft–verify cycle. Given, for every decoding
position p of some recorded answers and every choice j, the tokens the cycle would emit there
(tokens[p, j], ≥ 1) and its milliseconds (ms[p, j]), the best trajectory's Σ tokens / Σ ms is
what a chooser that knew each cycle's outcome beforehand would reach: a shortfall of a real
policy is then read as a weak policy, a small ceiling as small headroom. The ratio is maximised
by Dinkelbach's iteration: at a rate λ, a backward pass over each answer's positions finds the
trajectory maximising Σ (tokens − λ·ms); λ becomes its rate until it stops rising.
"""

from __future__ import annotations

import numpy as np


def hindsight_rate(
    tokens: np.ndarray, ms: np.ndarray, answer: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray]:
    """(tokens per ms, visited positions, their choices) of the best trajectory; `answer[p]`:
    which answer position p belongs to (each answer's positions consecutive, in order)."""
    starts = np.flatnonzero(np.r_[True, answer[1:] != answer[:-1]])
    ends = np.r_[starts[1:], len(answer)]
    rate, best = 0.0, None
    for _ in range(100):
        value = tokens - rate * ms
        chosen = np.zeros(len(answer), dtype=np.int64)
        for start, end in zip(starts, ends, strict=True):
            future = np.zeros(end - start + 1 + tokens.max())  # 0 past the answer's last position
            for p in range(end - 1, start - 1, -1):
                total = value[p] + future[p - start + tokens[p]]
                chosen[p] = int(np.argmax(total))
                future[p - start] = total[chosen[p]]
        found, steps = decoded_rate(tokens, ms, answer, chosen)
        if best is not None and found <= rate * (1 + 1e-12):
            break
        rate, best = found, (steps, chosen[steps])
    return rate, *best


def decoded_rate(
    tokens: np.ndarray, ms: np.ndarray, answer: np.ndarray, chosen: np.ndarray
) -> tuple[float, np.ndarray]:
    """(tokens per ms, visited positions) of decoding every answer when each position p takes
    its `chosen[p]` choice."""
    starts = np.flatnonzero(np.r_[True, answer[1:] != answer[:-1]])
    ends = np.r_[starts[1:], len(answer)]
    steps = []
    for start, end in zip(starts, ends, strict=True):
        p = start
        while p < end:
            steps.append(p)
            p += int(tokens[p, chosen[p]])
    steps = np.array(steps, dtype=np.int64)
    picks = chosen[steps]
    return float(tokens[steps, picks].sum() / ms[steps, picks].sum()), steps
