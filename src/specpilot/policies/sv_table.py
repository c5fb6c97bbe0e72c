"""SV's offline acceptance-probability profile p̂[bin(S), bin(A)] (SV paper §4.2, §7.3;
docs/methods.md §4.1).

Profiling records, for every drafted token, the draft/companion similarity S = 1 − TV(P_d, P_c),
the companion-as-target acceptance A = min(1, P_c(t)/P_d(t)) and the target's acceptance α. At
run time SV only sees S and A, so it estimates P(accept) as the mean α of profiled tokens with
similar (S, A). This module is model-free: it bins, averages, looks up and measures how much
(S, A) tells about α; the engine computes S and A.

Binning, shared by `AcceptanceTable.fit` and `information_gain` through `_bin_records`:

* S: equal-frequency (quantile) bins. Each cut sits at an order-statistic position round(q·n)
  and is placed halfway between two *distinct* neighbouring values; a cut that would fall inside
  a run of tied values moves to the nearer end of the run, and coinciding cuts merge. So discrete
  data give fewer bins instead of empty ones, and no edge equals a profiled value, so which side
  of an edge a profiled value lands on is never ambiguous. A value x goes to bin #{edges ≤ x}.
* A: A has a point mass at exactly 1 (whenever P_c ≥ P_d), which would swallow several quantile
  bins; A ≥ 1 − 1e-9 gets its own, last, column and the records with A < 1 are quantile-binned as
  above.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specpilot.config import require
from specpilot.errors import ConfigError

A_ONE = 1.0 - 1e-9
"""A at or above this is the point mass A == 1 (companion at least as confident as the draft)."""

_KEYS = ("s_edges", "a_edges", "cells", "counts", "s_marginal", "global_mean", "min_count")


def _as_array(x: Any, name: str) -> np.ndarray:
    """A float64 array from a float, sequence, numpy array or (any-device) torch tensor."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} must be numbers, got {type(x).__name__}") from exc


def _records(s: Any, a: Any, alpha: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated 1-D profiling records (S, A, α), all of one non-zero length."""
    arrays = {"s": _as_array(s, "s"), "a": _as_array(a, "a"), "alpha": _as_array(alpha, "alpha")}
    for name, arr in arrays.items():
        require(arr.ndim == 1, f"{name} must be 1-D, got shape {arr.shape}")
        require(bool(np.isfinite(arr).all()), f"{name} contains NaN or inf")
    lengths = {name: len(arr) for name, arr in arrays.items()}
    require(len(set(lengths.values())) == 1, f"s, a and alpha differ in length: {lengths}")
    require(lengths["s"] > 0, "no profiling records: s, a and alpha are empty")
    alpha_arr = arrays["alpha"]
    require(
        bool(((alpha_arr >= 0) & (alpha_arr <= 1)).all()),
        "alpha must lie in [0, 1] (it is an acceptance probability)",
    )
    return arrays["s"], arrays["a"], alpha_arr


def _quantile_edges(values: np.ndarray, bins: int) -> np.ndarray:
    """Inner edges of at most `bins` equal-frequency bins, each strictly between two distinct
    values of `values` (see the module docstring)."""
    v = np.sort(values)
    n = len(v)
    edges: set[float] = set()
    for q in np.arange(1, bins) / bins if n > 1 else ():
        k = min(max(round(q * n), 1), n - 1)
        if v[k - 1] == v[k]:  # inside a run of ties: move to the nearer end of the run
            lo = int(np.searchsorted(v, v[k], side="left"))
            hi = int(np.searchsorted(v, v[k], side="right"))
            options = [c for c in (lo, hi) if 0 < c < n]
            if not options:
                continue  # every value is the same: no cut possible
            k = min(options, key=lambda c: abs(c - k))
        edges.add(float((v[k - 1] + v[k]) / 2))
    return np.array(sorted(edges), dtype=np.float64)


def _assign(
    s: np.ndarray, a: np.ndarray, s_edges: np.ndarray, a_edges: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(S bin, A column) per record; the A == 1 column is the last, len(a_edges) + 1."""
    s_idx = np.searchsorted(s_edges, s, side="right")
    a_idx = np.where(a >= A_ONE, len(a_edges) + 1, np.searchsorted(a_edges, a, side="right"))
    return s_idx, a_idx


def _bin_records(
    s: np.ndarray, a: np.ndarray, s_bins: int, a_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fit the S and A edges on the records and bin them: (s_edges, a_edges, s_idx, a_idx)."""
    require(s_bins >= 1 and a_bins >= 1, f"s_bins and a_bins must be >= 1, got {s_bins}, {a_bins}")
    s_edges = _quantile_edges(s, s_bins)
    a_edges = _quantile_edges(a[a < A_ONE], a_bins)
    s_idx, a_idx = _assign(s, a, s_edges, a_edges)
    return s_edges, a_edges, s_idx, a_idx


@dataclass
class AcceptanceTable:
    """p̂[s_bin][a_bin]: the mean target acceptance α of profiled tokens in each (S, A) cell.

    `cells` already hold the fallbacks: a cell with fewer than `min_count` records takes its S
    bin's mean (`s_marginal`) when that bin has `min_count` records, else `global_mean` — a mean
    of a handful of records is noise, and S is the stronger of the two indicators. `counts` are
    the raw record counts, kept for diagnostics. `s_marginal` is the raw mean α per S bin
    (`global_mean` for an S bin without records). Lists, not arrays, so `to_dict` is JSON as is.
    """

    s_edges: list[float]
    a_edges: list[float]
    cells: list[list[float]]
    counts: list[list[int]]
    s_marginal: list[float]
    global_mean: float
    min_count: int = 20
    _grid: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require(
            isinstance(self.min_count, int | np.integer) and self.min_count >= 1,
            f"min_count must be an integer >= 1, got {self.min_count!r}",
        )
        self.min_count = int(self.min_count)
        self.s_edges = self._edges(self.s_edges, "s_edges")
        self.a_edges = self._edges(self.a_edges, "a_edges")
        rows, cols = len(self.s_edges) + 1, len(self.a_edges) + 2
        grid = self._matrix(self.cells, "cells", rows, cols)
        counts = self._matrix(self.counts, "counts", rows, cols)
        require(bool((grid >= 0).all() and (grid <= 1).all()), "cells must lie in [0, 1]")
        require(
            bool((counts >= 0).all() and (counts == np.round(counts)).all()),
            "counts must be non-negative integers",
        )
        marginal = _as_array(self.s_marginal, "s_marginal")
        require(
            marginal.shape == (rows,),
            f"s_marginal must have one value per S bin ({rows}), got shape {marginal.shape}",
        )
        require(
            np.isfinite(self.global_mean) and 0 <= self.global_mean <= 1,
            f"global_mean must lie in [0, 1], got {self.global_mean}",
        )
        self.cells = grid.tolist()
        self.counts = counts.astype(int).tolist()
        self.s_marginal = marginal.tolist()
        self.global_mean = float(self.global_mean)
        self._grid = grid

    @staticmethod
    def _edges(edges: Any, name: str) -> list[float]:
        arr = _as_array(edges, name)
        require(arr.ndim == 1, f"{name} must be a flat list, got shape {arr.shape}")
        require(bool(np.isfinite(arr).all()), f"{name} contains NaN or inf")
        require(bool((np.diff(arr) > 0).all()), f"{name} must be strictly increasing")
        return arr.tolist()

    @staticmethod
    def _matrix(values: Any, name: str, rows: int, cols: int) -> np.ndarray:
        arr = _as_array(values, name)
        require(
            arr.shape == (rows, cols),
            f"{name} must be {rows} S bins x {cols} A bins (len(s_edges) + 1 by "
            f"len(a_edges) + 2, the last for A == 1), got shape {arr.shape}",
        )
        require(bool(np.isfinite(arr).all()), f"{name} contains NaN or inf")
        return arr

    @property
    def shape(self) -> tuple[int, int]:
        """(S bins, A bins including the A == 1 bin)."""
        return self._grid.shape

    @classmethod
    def fit(
        cls,
        s: Any,
        a: Any,
        alpha: Any,
        s_bins: int = 16,
        a_bins: int = 16,
        min_count: int = 20,
    ) -> AcceptanceTable:
        """Profile table from records (S_i, A_i, α_i). Asking for `s_bins`/`a_bins` gives at
        most that many (fewer where tied values merge cuts); A == 1 adds one column."""
        s_arr, a_arr, alpha_arr = _records(s, a, alpha)
        require(min_count >= 1, f"min_count must be >= 1, got {min_count}")
        s_edges, a_edges, s_idx, a_idx = _bin_records(s_arr, a_arr, s_bins, a_bins)
        rows, cols = len(s_edges) + 1, len(a_edges) + 2
        flat = s_idx * cols + a_idx
        counts = np.bincount(flat, minlength=rows * cols).reshape(rows, cols)
        sums = np.bincount(flat, weights=alpha_arr, minlength=rows * cols).reshape(rows, cols)
        global_mean = float(alpha_arr.mean())
        row_counts, row_sums = counts.sum(axis=1), sums.sum(axis=1)
        marginal = np.where(row_counts > 0, row_sums / np.maximum(row_counts, 1), global_mean)
        fallback = np.where(row_counts >= min_count, marginal, global_mean)
        cells = np.where(counts >= min_count, sums / np.maximum(counts, 1), fallback[:, None])
        return cls(
            s_edges=s_edges.tolist(),
            a_edges=a_edges.tolist(),
            cells=np.clip(cells, 0.0, 1.0).tolist(),
            counts=counts.tolist(),
            s_marginal=marginal.tolist(),
            global_mean=global_mean,
            min_count=min_count,
        )

    def lookup(self, s: Any, a: Any) -> float | np.ndarray:
        """p̂ for indicator values: a float for two scalars, else an array of the broadcast
        shape. Values outside the profiled range take the nearest end bin."""
        s_arr, a_arr = _as_array(s, "s"), _as_array(a, "a")
        try:
            s_arr, a_arr = np.broadcast_arrays(s_arr, a_arr)
        except ValueError as exc:
            raise ConfigError(f"s and a shapes differ: {s_arr.shape} vs {a_arr.shape}") from exc
        s_idx, a_idx = _assign(s_arr, a_arr, np.asarray(self.s_edges), np.asarray(self.a_edges))
        p = np.clip(self._grid[s_idx, a_idx], 0.0, 1.0)
        return float(p) if p.ndim == 0 else p

    def to_dict(self) -> dict:
        """JSON-ready dict; `from_dict` inverts it."""
        return {key: copy.deepcopy(getattr(self, key)) for key in _KEYS}

    @classmethod
    def from_dict(cls, d: dict) -> AcceptanceTable:
        """Table from `to_dict` output (e.g. read back from JSON)."""
        require(isinstance(d, dict), f"acceptance table must be a dict, got {type(d).__name__}")
        for key in _KEYS:
            require(key in d, f"acceptance table is missing key {key!r} (expected keys: {_KEYS})")
        return cls(**{key: d[key] for key in _KEYS})


def _entropy(labels: np.ndarray) -> float:
    """Plug-in entropy in bits of integer labels."""
    _, counts = np.unique(labels, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def _conditional_entropy(x: np.ndarray, y: np.ndarray, x_bins: int) -> float:
    """H(X | Y) = H(X, Y) − H(Y) = Σ_y P(y) H(X | y), in bits."""
    return max(_entropy(y * x_bins + x) - _entropy(y), 0.0)


PERMUTATIONS = 8


def information_gain(
    s: Any,
    a: Any,
    alpha: Any,
    x_bins: int = 10,
    s_bins: int = 16,
    a_bins: int = 16,
) -> dict:
    """How much knowing (S, A) reduces the entropy of the acceptance probability (paper Table 2).

    X is α in `x_bins` equal-width bins on [0, 1] (α = 1 in the last); S and A are binned exactly
    as `AcceptanceTable.fit` bins them. Returns bits: H_X, H_X_given_SA, IG_SA = H(X) − H(X|S,A),
    IG_S, IG_A, relative_* = IG/H_X (0 when H_X = 0), plus n and the bin counts used. Plug-in
    estimates: IG is biased upward by about (cells − 1)(x_bins − 1) / (2 n ln 2) bits, so on few
    records fine bins overstate what (S, A) explain. IG_*_corrected subtracts the mean gain the
    same bins show for α shuffled against (S, A) (PERMUTATIONS shuffles, fixed seed): what is
    left is information, not sample noise. Compare those on small profiles.
    """
    require(x_bins >= 1, f"x_bins must be >= 1, got {x_bins}")
    s_arr, a_arr, alpha_arr = _records(s, a, alpha)
    s_edges, a_edges, s_idx, a_idx = _bin_records(s_arr, a_arr, s_bins, a_bins)
    x = np.minimum((alpha_arr * x_bins).astype(np.int64), x_bins - 1)
    cols = len(a_edges) + 2
    h_x = _entropy(x)
    h_given = {
        "SA": _conditional_entropy(x, s_idx * cols + a_idx, x_bins),
        "S": _conditional_entropy(x, s_idx, x_bins),
        "A": _conditional_entropy(x, a_idx, x_bins),
    }
    groups = {"SA": s_idx * cols + a_idx, "S": s_idx, "A": a_idx}
    result: dict = {"H_X": h_x, "H_X_given_SA": h_given["SA"]}
    for key, h in h_given.items():
        gain = max(h_x - h, 0.0)
        result[f"IG_{key}"] = gain
        result[f"relative_{key}"] = gain / h_x if h_x > 0 else 0.0
        shuffles = np.random.default_rng(0)
        null = [
            h_x - _conditional_entropy(shuffles.permutation(x), groups[key], x_bins)
            for _ in range(PERMUTATIONS)
        ]
        result[f"IG_{key}_corrected"] = max(gain - float(np.mean(null)), 0.0)
    result.update(n=len(x), s_bins_used=len(s_edges) + 1, a_bins_used=cols)
    return result
