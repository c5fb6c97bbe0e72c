"""What CPU this is: its model name and flags, read once from /proc/cpuinfo. The dtype choice
(native bf16 or not), the measured GEMM plans' cache key and the bench's machine record all
depend on them."""

from __future__ import annotations

import functools
from pathlib import Path

SPEED_FLAGS = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
"""The CPU flags that decide decoding speed here: a bench records which of them it ran with."""


@functools.lru_cache(maxsize=1)
def cpu_info() -> tuple[str | None, frozenset[str]]:
    """The CPU's model name and flags from /proc/cpuinfo; (None, no flags) where there is none
    (non-Linux systems)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None, frozenset()
    model, flags = None, set()
    for line in text.splitlines():
        if line.startswith("model name") and model is None:
            model = line.split(":", 1)[1].strip()
        elif line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    return model, frozenset(flags)
