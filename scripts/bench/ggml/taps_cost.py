"""What the taps' eval callback costs a forward that taps nothing: one-token decode steps of the
default 1.5B on ggml, a runner with the callback installed (`enable_taps`) against one without,
on the same GGUF after a 128-token context, alternating blocks of 20 steps (the first block warms
up). models/ggml/taps.py quotes the result.

    python scripts/bench/ggml/taps_cost.py
"""

import statistics
import time

from specpilot.models.ggml import GgmlRunner
from specpilot.models.ggml.files import ensure_gguf

path = ensure_gguf("qwen2.5-coder-1.5b-instruct")
plain = GgmlRunner(path, max_length=1024)
tapped = GgmlRunner(path, max_length=1024)
tapped.enable_taps()
CONTEXT = [(i * 7919) % 150000 for i in range(128)]
times = {"plain": [], "taps": []}
for runner in (plain, tapped):
    runner.forward(CONTEXT, logits="none")
for block in range(6):
    order = (("plain", plain), ("taps", tapped))
    for name, runner in order if block % 2 == 0 else order[::-1]:
        for step in range(20):
            start = time.perf_counter()
            runner.forward([(step * 31 + 5) % 150000], logits="all")
            elapsed = time.perf_counter() - start
            runner.rollback(len(CONTEXT))
            if block:
                times[name].append(elapsed * 1e3)
for name, values in times.items():
    median, mean = statistics.median(values), statistics.mean(values)
    print(f"{name}: median {median:.2f} ms, mean {mean:.2f} ms over {len(values)} steps")
difference = statistics.median(times["taps"]) - statistics.median(times["plain"])
print(f"taps - plain (medians): {difference:.2f} ms")
