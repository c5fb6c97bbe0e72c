"""Bench reports: a text table, the JSON document, and the machine description."""

from __future__ import annotations

import platform

import torch

from specpilot.models.cpu import SPEED_FLAGS, cpu_info


def memory_bandwidth_gbs(megabytes: int = 1024, repeats: int = 5) -> float:
    """Read bandwidth in GB/s: the best of a few sums over a buffer far larger than the caches."""
    import time

    buffer = torch.ones(megabytes * 2**20 // 4)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best / 1e9


def machine_info() -> dict:
    """The machine a report was measured on: CPU model and the flags that set its speed (AVX2
    alone, AVX-512, native bf16), threads, torch, Python, GPU, and the llama.cpp build (its
    version; whether it has specpilot's multi-row kernels)."""
    from specpilot.models.ggml import library

    model, flags = cpu_info()
    llama_cpp = None
    if library.available():
        import llama_cpp as module

        llama_cpp = {"version": module.__version__, "multirow": library.multirow_kernels()}
    return {
        "cpu": model or platform.processor(),
        "cpu_flags": sorted(flags & SPEED_FLAGS),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "llama_cpp": llama_cpp,
    }


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


COLUMNS = [  # (header, row key, width, format)
    ("method", "method", 44, "s"),
    ("category", "category", 12, "s"),
    ("n", "prompts", 3, "d"),
    ("tok/s", "tokens_per_s", 7, ".2f"),
    ("speedup", "speedup", 7, ".2f"),
    ("MAT", "mean_accepted_tokens", 5, ".2f"),
    ("acc", "acceptance_rate", 5, ".2f"),
    ("draft s", "draft_s", 8, ".1f"),
    ("verify s", "verify_s", 8, ".1f"),
    ("mism", "greedy_mismatches", 4, "d"),
]


def table(rows: list[dict]) -> str:
    """The bench report's rows as text; '-' where a value does not apply (e.g. MAT of plain
    decoding)."""
    return fixed_width_table(rows, COLUMNS)


def fixed_width_table(rows: list[dict], columns: list[tuple[str, str, int, str]]) -> str:
    """Rows as a fixed-width text table: columns are (header, row key, width, format); text
    columns (format "s") are cut to their width and left-aligned, numbers right-aligned, None
    is '-'."""
    header = " ".join(f"{name:>{width}s}" for name, _, width, _ in columns)
    lines = [header, "-" * len(header)]
    for row in rows:
        cells = []
        for _, key, width, spec in columns:
            value = row[key]
            text = str(value)[:width] if spec == "s" else _fmt(value, spec)
            cells.append(f"{text:<{width}s}" if spec == "s" else f"{text:>{width}s}")
        lines.append(" ".join(cells))
    return "\n".join(lines)
