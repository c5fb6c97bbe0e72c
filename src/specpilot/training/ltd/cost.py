"""LTD's cost model: the wall time of a draft–verify cycle for a (depth, size) choice.

T(d, V, L) = T_draft(d) + T_verify(V + 1, L).

T_draft(d) is the drafter's cumulative time to grow d levels (catch-up and root included):
from a profile's feature-drafter step times (`specpilot profile --eagle-head default`: one
step, then a level of 8 rows per further level; a level's cost barely depends on its rows at
these sizes), else the median over the replay positions where it was measured while recording
(inflated if the machine was busy).

T_verify(n, L) is one target forward over n new tokens after L cached ones, linear in n between
measured points (beyond the last, along the whole curve's mean slope) and in L between measured
contexts: from `specpilot profile --out FILE` (its verify_ms curves; profile with --max-verify
256 to cover the largest trees) or, without one, measured here (MEASURED_SIZES). Tree-mask
building and the commit are left out (small next to the target forward).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from specpilot.policies.latency import interpolate, read_verify_curves

MEASURED_SIZES = (
    *range(1, 66),
    *(n + e for n in range(80, 257, 16) for e in (0, 1) if n + e <= 256),
)
"""Every size to 65, then both sides of each further multiple of 16: a CPU's matrix kernels work
in blocks of rows, so T_verify steps rather than grows along a line. Measured at powers of two
and interpolated, the AVX-512-bf16 EPYC's curve said a 17-token verify (a static tree of 16
nodes) costs 269 ms against 262 at 16; in decoding it cost ~365 ms, against ~225 ms for trees
of at most 16 tokens, so the replay's best static tree was one that loses (BENCHMARKS §11.6)."""
MEASURED_CONTEXTS = (128, 512)


@dataclass
class CostModel:
    draft_ms: list[float]
    """Cumulative draft milliseconds to reach depth d = 1..max_depth."""
    contexts: list[int]
    sizes: list[int]
    verify_ms: list[list[float]]
    """verify_ms[c][i]: one target forward over sizes[i] new tokens after contexts[c]."""
    source: str = ""

    def __post_init__(self) -> None:
        # (size, ms) points per context, built once: verify() runs on every environment step.
        self._curves = [list(zip(self.sizes, row, strict=True)) for row in self.verify_ms]

    def draft(self, depth: int) -> float:
        return self.draft_ms[depth - 1]

    def verify(self, tokens: int, context: int) -> float:
        rows = [interpolate(curve, tokens) for curve in self._curves]
        if len(rows) == 1:
            return rows[0]
        return float(np.interp(context, self.contexts, rows))

    def cycle_ms(self, depth: int, size: int, context: int) -> float:
        """Draft `depth` levels and verify `size` candidates plus the root."""
        return self.draft(depth) + self.verify(size + 1, context)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> CostModel:
        return cls(**json.loads(path.read_text()))


def draft_curve(draft_ms: np.ndarray) -> list[float]:
    """Median cumulative draft time per depth over the replay positions ([positions, depth])."""
    return [float(v) for v in np.median(draft_ms, axis=0)]


def verify_from_profile(path: str | Path) -> tuple[list[int], list[int], list[list[float]]]:
    """(contexts, sizes, ms) from a `specpilot profile` JSON."""
    curves = read_verify_curves(path)
    contexts = list(curves)
    width = min(len(curves[c]) for c in contexts)
    sizes = list(range(1, width + 1))
    return contexts, sizes, [curves[c][:width] for c in contexts]


def draft_from_profile(path: str | Path, max_depth: int) -> list[float] | None:
    """Cumulative draft ms per depth from a profile's eagle_step_ms, None if it has none."""
    steps = json.loads(Path(path).read_text()).get("eagle_step_ms")
    if not steps:
        return None
    first, level = float(steps["1"]), float(steps["8"])
    return [first + d * level for d in range(max_depth)]


def measure_verify(runner, repeats: int = 3, progress: bool = True):
    """(contexts, sizes, ms) measured now on `runner` (when no profile is given)."""
    from tqdm import tqdm

    from specpilot.bench.profile import latency_points

    contexts = [c for c in MEASURED_CONTEXTS if c + MEASURED_SIZES[-1] <= runner.max_length]
    contexts = contexts or [max(1, runner.max_length // 4)]
    sizes = [n for n in MEASURED_SIZES if contexts[-1] + n <= runner.max_length]
    bar = tqdm(total=len(contexts) * len(sizes), desc="verify latency", disable=not progress)
    ms = [latency_points(runner, c, sizes, repeats, bar) for c in contexts]
    bar.close()
    return contexts, sizes, ms
