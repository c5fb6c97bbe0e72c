"""Latency curves learned from the decode loop's own timings (docs/methods.md §7.2).

The goodput controller needs T_verify(n), the seconds of one target forward over n tokens in
all, and T_draft(u), the seconds of drafting u units, on the machine it runs on. Both change by
an order of magnitude between machines (a float32-only CPU pays ~4x for 8 tokens, a bf16 one
~1.1x), so they are measured, not assumed: every step adds one (size, seconds) sample.

Estimator, chosen for a CPU shared with other work: per size, the median of its last `window`
samples, the lower middle one of an even count (a step slowed by another process is an outlier
the median ignores, and old samples age out as the context grows; the noise is one-sided, since
other work and the kernels a new shape builds on its first forward only slow a step, so of two
samples the faster is the better guess). More work never takes less time, and the noise only
slows, so a size timed slower than a larger one was slowed: each size's median is lowered to
the least of the larger sizes' (the lower envelope from the right; pooling the violators
instead would let one rarely timed slow size flatten its neighbours). A prior curve (a
`specpilot profile` JSON) fills sizes never measured, scaled by the median ratio of measured to
prior where both exist (load and context differ from when it was profiled), and is made
non-decreasing with them by weighted pool-adjacent-violators (a prior is a guess of the shape,
not a timing whose noise only slows); linear between sizes. A timing older than `max_age`
samples of the curve is forgotten: a size timed only while another process ran, and never
again because that timing ruled out the plans that feed it, would otherwise stay slow for the
life of the engine. The measurements behind these choices: docs/methods.md §7.2, §7.9.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from specpilot.config import require
from specpilot.errors import ConfigError


def interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise-linear T(x) through (size, seconds) points sorted by size: flat below the first
    point; beyond the last, the average slope over the whole measured range (robust to a noisy
    last point), never negative (feeding more tokens is never faster). The one rule every
    latency curve in the project uses."""
    require(len(points) > 0, "a latency curve needs at least one point")
    (n0, t0), (n1, t1) = points[0], points[-1]
    if x <= n0:
        return t0
    if x >= n1:
        slope = max((t1 - t0) / (n1 - n0), 0.0) if n1 > n0 else 0.0
        return t1 + slope * (x - n1)
    i = bisect.bisect_left(points, x, key=lambda point: point[0])
    (na, ta), (nb, tb) = points[i - 1], points[i]
    return ta + (tb - ta) * (x - na) / (nb - na)


def read_verify_curves(source: str | Path | dict[str, Any]) -> dict[int, list[float]]:
    """The verify-latency curves of a `specpilot profile` JSON (its path, or the loaded dict):
    {context length: [ms of one target forward over 1, 2, ... new tokens]}."""
    where = "profile" if isinstance(source, dict) else repr(str(source))
    if isinstance(source, dict):
        profile = source
    else:
        try:
            profile = json.loads(Path(source).read_text())
        except (OSError, ValueError) as error:
            raise ConfigError(f"cannot read latency profile {where} ({error})") from None
    curves = profile.get("verify_ms") if isinstance(profile, dict) else None
    if not curves or not isinstance(curves, dict):
        raise ConfigError(
            f"{where} has no verify-latency curves ('verify_ms'); "
            "run `specpilot profile --out PATH` first"
        )
    try:
        by_context = {int(c): curve for c, curve in curves.items()}
    except ValueError as exc:
        raise ConfigError(f"verify_ms keys must be context lengths, got {list(curves)}") from exc
    for context, curve in by_context.items():
        require(
            isinstance(curve, list)
            and len(curve) > 0
            and all(isinstance(ms, int | float) and not isinstance(ms, bool) for ms in curve),
            f"verify_ms['{context}'] must be a non-empty list of milliseconds",
        )
    return {c: [float(ms) for ms in by_context[c]] for c in sorted(by_context)}


class LatencyCurve:
    """T(size) from samples. `proportional`: a cost that scales with its size and is 0 at 0
    (drafting: u draft forwards) — below and beyond the measured sizes it is scaled in
    proportion, and with no sample it is 0 (optimistic, so the controller tries it and learns).
    Otherwise (verification, size >= 1): flat below the first size; beyond the last, its
    average slope over the measured range (flat with one size: optimistic, so larger sizes get
    tried once). `max_age`: samples of the curve (any size) after which a timing is forgotten
    (None: never)."""

    def __init__(
        self,
        prior: Iterable[tuple[float, float]] = (),
        window: int = 9,
        proportional: bool = False,
        max_age: int | None = None,
    ) -> None:
        require(window >= 1, f"latency window must be >= 1, got {window}")
        require(max_age is None or max_age >= 1, f"latency max_age must be >= 1, got {max_age}")
        self.prior = {float(n): float(t) for n, t in prior}
        require(
            all(n >= 1 and math.isfinite(t) and t > 0 for n, t in self.prior.items()),
            "a prior latency curve needs sizes >= 1 and seconds > 0",
        )
        self.window = window
        self.proportional = proportional
        self.max_age = max_age
        self.clock = 0
        """Samples added so far, all sizes: the age unit."""
        self.samples: dict[float, deque[tuple[int, float]]] = {}
        """Per size, its last `window` (clock, seconds) samples."""
        self._points: list[tuple[float, float]] | None = None

    def add(self, size: float, seconds: float) -> None:
        """One measured step; a size of 0 (nothing to time) or a non-positive time is ignored."""
        if size <= 0 or not math.isfinite(seconds) or seconds <= 0:
            return
        self.clock += 1
        self.samples.setdefault(float(size), deque(maxlen=self.window)).append(
            (self.clock, float(seconds))
        )
        if self.max_age is not None:  # forget what is max_age samples old
            oldest = self.clock - self.max_age
            for n, held in list(self.samples.items()):
                while held and held[0][0] <= oldest:
                    held.popleft()
                if not held:
                    del self.samples[n]
        self._points = None

    def measured(self, size: float) -> int:
        """Samples held at this size (not yet forgotten)."""
        return len(self.samples.get(float(size), ()))

    def points(self) -> list[tuple[float, float]]:
        """The fitted (size, seconds) points, increasing in both."""
        if self._points is None:
            self._points = self._fit()
        return self._points

    def _fit(self) -> list[tuple[float, float]]:
        medians: dict[float, tuple[float, int]] = {}
        least = math.inf
        for n in sorted(self.samples, reverse=True):  # the lower envelope from the right
            least = min(least, statistics.median_low(t for _, t in self.samples[n]))
            medians[n] = (least, len(self.samples[n]))
        ratios = [medians[n][0] / t for n, t in self.prior.items() if n in medians]
        scale = statistics.median(ratios) if ratios else 1.0
        for n, t in self.prior.items():
            medians.setdefault(n, (t * scale, 1))
        blocks: list[tuple[list[float], float, float]] = []  # (sizes, mean, weight)
        for n in sorted(medians):
            sizes, mean, weight = [n], *medians[n]
            while blocks and blocks[-1][1] > mean:
                before, before_mean, before_weight = blocks.pop()
                total = before_weight + weight
                sizes = before + sizes
                mean = (before_mean * before_weight + mean * weight) / total
                weight = total
            blocks.append((sizes, mean, weight))
        return [(n, mean) for sizes, mean, _ in blocks for n in sizes]

    def __call__(self, size: float) -> float:
        pts = self.points()
        if self.proportional:
            if size <= 0 or not pts:
                return 0.0
            (n0, t0), (n1, t1) = pts[0], pts[-1]
            if size <= n0 or size >= n1:
                return (t0 / n0 if size <= n0 else t1 / n1) * size
            return interpolate(pts, size)
        if not pts:
            raise ValueError("no verify latency measured yet")
        return interpolate(pts, size)

    def __repr__(self) -> str:
        return f"LatencyCurve({len(self.points())} points, {len(self.samples)} measured sizes)"


class VerifyLatency:
    """T(n) from measured points (`policies.latency.interpolate`: linear between them, flat below
    the first, beyond the last the measured range's average slope, never falling). n is the
    number of tokens fed: γ + 1 for one request, the total over rows for a batch."""

    def __init__(self, points: Iterable[tuple[float, float]], context: int | None = None) -> None:
        pts = sorted((float(n), float(t)) for n, t in points)
        require(len(pts) > 0, "verify latency needs at least one (n, seconds) point")
        require(
            all(math.isfinite(n) and n >= 1 for n, _ in pts),
            f"verify latency points need n >= 1, got {[n for n, _ in pts]}",
        )
        require(
            all(math.isfinite(t) and t > 0 for _, t in pts),
            f"verify latencies must be > 0 seconds, got {[t for _, t in pts]}",
        )
        ns = [n for n, _ in pts]
        require(len(set(ns)) == len(ns), f"verify latency points repeat an n: {ns}")
        self.points: tuple[tuple[float, float], ...] = tuple(pts)
        self.context = context

    @classmethod
    def from_profile(
        cls, profile: dict[str, Any] | str | Path, context: int | None = None
    ) -> VerifyLatency:
        """The curve of a `specpilot profile` JSON (loaded, or its path) whose context is nearest
        `context` (ties: the shorter; default: the shortest). verify_ms[str(c)][i] is T(i + 1)
        in milliseconds."""
        by_context = read_verify_curves(profile)
        wanted = min(by_context) if context is None else context
        chosen = min(by_context, key=lambda c: (abs(c - wanted), c))
        points = [(i + 1, ms / 1000.0) for i, ms in enumerate(by_context[chosen])]
        return cls(points, context=chosen)

    def __call__(self, n: float) -> float:
        require(n >= 1, f"verify latency needs n >= 1 tokens, got {n}")
        return interpolate(self.points, n)

    def __repr__(self) -> str:
        return f"VerifyLatency({len(self.points)} points, context={self.context})"
