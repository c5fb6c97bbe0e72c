"""Bench reports: a text table, the JSON document, and the machine description."""

from __future__ import annotations

import platform

import torch


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
    cpu = platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
    header = f"{'method':44s} {'category':12s} {'n':>3s} {'tok/s':>7s} {'speedup':>7s} {'MAT':>5s} {'acc':>5s} {'draft s':>8s} {'verify s':>8s} {'mism':>4s}"
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row['method'][:44]:44s} {row['category'][:12]:12s} {row['prompts']:3d} "
            f"{row['tokens_per_s']:7.2f} {_fmt(row['speedup'], '7.2f')} {_fmt(row['mean_accepted_tokens'], '5.2f')} "
            f"{_fmt(row['acceptance_rate'], '5.2f')} {_fmt(row['draft_s'], '8.1f')} {_fmt(row['verify_s'], '8.1f')} "
            f"{_fmt(row['greedy_mismatches'], '4d')}"
        )
    return "\n".join(lines)
