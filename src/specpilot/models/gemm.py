"""How a CPU multiplies a weight by a few rows fastest: measured once per machine, not assumed.

Verification lives on T(n), the cost of one target forward over n tokens, and a CPU's matrix
kernels make it irregular. Measured on an AVX2-only AMD EPYC in float32 (Qwen2.5-Coder-1.5B,
whole forward): with the rows column-major (how the previous matrix product leaves them),
T(2) = 1.7 T(1), T(4) = 1.55 T(1), T(15) = 4.4 T(1) but T(16) = 2.2 T(1); with the rows made
row-major first, T(2) ≈ T(4) ≈ T(1). Even one row can pay for padding: on an AVX-512 EPYC in
float32, `torch.mv` with the 1.5B's gate+up weight took 7.0 ms and the product with two rows
(one of them zeros) 3.0 ms. Which layout wins, and which row counts are cheap, depend
on the CPU, the dtype, the kernel library and the weight's shape, so a `GemmPlan` is measured
for each of the model's MLP weights (most of a step's weight bytes): for each row count n,
the layout and the row count m ≥ n to feed (zero rows appended, their outputs dropped) that ran
fastest. Each output row depends only on its input row, so a plan changes kernels, not what is
computed.

Measuring takes seconds, so a plan is kept on disk per CPU (model name and flags), torch
version, thread count, dtype and weight shape, and only weights large enough for streaming them
to dominate (`MIN_BYTES`) get one; smaller ones keep the plain product.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specpilot.models.cpu import cpu_info

MAX_ROWS = 48
"""Largest row count a plan covers (a batch of 16 verifying two tokens each); beyond it the
rows are fed as they come."""

MIN_BYTES = 16 * 2**20
"""Weights smaller than this get no plan: the product is not bound by streaming the weight."""

MIN_SAVING = 0.1
"""A layout or padding other than the plain one is kept only when it measured this much faster
(a wrong choice from a noisy timing would cost every step)."""

LAYOUTS = ("row", "column")

PLAN_FORMAT = "2"
"""Part of the cache key: plans of format 1 never padded one row, since one row was not timed."""


@dataclass(frozen=True)
class GemmPlan:
    """For n = 1..len(rows): `rows[n-1]` rows fed (n plus zero padding) in `layouts[n-1]`
    ("row": x row-major, "column": x column-major). One row fed as one row goes to
    `torch.mv`."""

    rows: tuple[int, ...]
    layouts: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.rows) != len(self.layouts):
            raise ValueError("a GemmPlan needs one layout per row count")
        for n, (m, layout) in enumerate(zip(self.rows, self.layouts, strict=True), start=1):
            if m < n or layout not in LAYOUTS:
                raise ValueError(f"bad GemmPlan entry for {n} rows: {m} rows, {layout!r}")

    @classmethod
    def choose(cls, seconds: dict[str, list[float]]) -> GemmPlan:
        """The plan from measured seconds per layout and row count (index n−1; one row:
        `torch.mv`, under "row"): per n, the fastest (layout, m ≥ n), unless it saves less than
        MIN_SAVING over feeding n rows in the layout that is fastest at n alone."""
        sizes = len(next(iter(seconds.values())))
        rows, layouts = [], []
        for n in range(1, sizes + 1):
            plain = min(LAYOUTS, key=lambda layout: seconds[layout][n - 1])
            best = min(
                ((layout, m) for layout in LAYOUTS for m in range(n, sizes + 1)),
                key=lambda choice: seconds[choice[0]][choice[1] - 1],
            )
            if seconds[best[0]][best[1] - 1] > (1 - MIN_SAVING) * seconds[plain][n - 1]:
                best = (plain, n)
            layouts.append(best[0])
            rows.append(best[1])
        return cls(tuple(rows), tuple(layouts))

    def to_json(self) -> dict:
        return {"rows": list(self.rows), "layouts": list(self.layouts)}

    @classmethod
    def from_json(cls, data: dict) -> GemmPlan:
        return cls(tuple(int(m) for m in data["rows"]), tuple(str(s) for s in data["layouts"]))


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    plan: GemmPlan | None = None,
) -> torch.Tensor:
    """x: [n, in] → [n, out]. On CPU as `weight @ x.T` (one row: `torch.mv`), following `plan`
    for the row count when it covers it: oneDNN's bf16 `F.linear` streams weights slowly, and
    measured on a Xeon, `mv` and `weight @ x.T` were 1.4-1.6x faster for 1-256 rows."""
    if x.requires_grad or weight.requires_grad or x.device.type != "cpu":
        return torch.nn.functional.linear(x, weight, bias)  # autograd and GPUs: the plain path
    n = x.shape[0]
    if n == 1 and (plan is None or plan.rows[0] == 1):
        out = torch.mv(weight, x[0])[None]
    else:
        if plan is not None and n <= len(plan.rows):
            fed, layout = plan.rows[n - 1], plan.layouts[n - 1]
            if fed > n:
                x = torch.cat([x, x.new_zeros(fed - n, x.shape[1])])
            x = x.contiguous() if layout == "row" else x.t().contiguous().t()
        out = torch.mm(weight, x.t()).t()[:n]
    return out if bias is None else out + bias


def _seconds(weight: torch.Tensor, x: torch.Tensor) -> float:
    """The unplanned product, as `linear` runs it (one row: `torch.mv`)."""
    start = time.perf_counter()
    linear(x, weight)
    return time.perf_counter() - start


def measure(weight: torch.Tensor, max_rows: int = MAX_ROWS, rounds: int = 3) -> GemmPlan:
    """Time `torch.mv` for one row and `weight @ x.T` for 2..max_rows rows in both layouts,
    and choose (GemmPlan.choose). Every (rows, layout) is timed once per round, after a
    warm-up round, and keeps its fastest round: noise from other work on the machine only adds
    time, and a burst of it then spoils one round of every size alike, not one size's every
    sample."""
    inputs = {}
    for n in range(1, max_rows + 1):
        x = torch.randn(n, weight.shape[1], dtype=weight.dtype, device=weight.device)
        inputs[n] = {"row": x} if n == 1 else {"row": x, "column": x.t().contiguous().t()}
    seconds = {layout: [math.inf] * max_rows for layout in LAYOUTS}
    for round_ in range(rounds + 1):
        for n, layouts in inputs.items():
            for layout, x in layouts.items():
                elapsed = _seconds(weight, x)
                if round_:
                    seconds[layout][n - 1] = min(seconds[layout][n - 1], elapsed)
    return GemmPlan.choose(seconds)


def _machine_key(weight: torch.Tensor, max_rows: int) -> str:
    """Everything a plan depends on, hashed: CPU model and flags, torch, threads, dtype, shape,
    the rows it covers."""
    model, flags = cpu_info()
    text = "|".join(
        [
            f"{model} {' '.join(sorted(flags))}",
            torch.__version__,
            str(torch.get_num_threads()),
            str(weight.dtype),
            str(tuple(weight.shape)),
            str(max_rows),
            PLAN_FORMAT,
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan_for(weight: torch.Tensor, max_rows: int = MAX_ROWS) -> GemmPlan | None:
    """The plan for products with `weight` on this machine: from the disk cache, else measured
    and cached; None off the CPU, for weights under MIN_BYTES, or when SPECPILOT_GEMM_PLAN=0."""
    from specpilot.files import cache_root

    if weight.device.type != "cpu" or os.environ.get("SPECPILOT_GEMM_PLAN") == "0":
        return None
    if weight.numel() * weight.element_size() < MIN_BYTES:
        return None
    path = cache_root() / "gemm" / f"{_machine_key(weight, max_rows)}.json"
    try:
        return GemmPlan.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or unreadable: measure again
    plan = measure(weight, max_rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
        json.dump(plan.to_json(), tmp)
    Path(tmp.name).replace(path)
    return plan
