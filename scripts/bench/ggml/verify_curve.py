"""T(n): milliseconds of one ggml forward over n new tokens with every row's logits, n = 1..16,
for the default 1.5B target as stored, after a 256-token context (medians of 4 repeats after a
warm-up). BENCHMARKS §0 compares llama-cpp-python builds with and without the multi-row kernels
by alternating runs of this script under each build's Python:

    for i in 1 2 3; do python_released verify_curve.py; python_patched verify_curve.py; done
"""

import statistics
import time

from specpilot.models.ggml import GgmlRunner
from specpilot.models.ggml.files import ensure_gguf
from specpilot.models.ggml.library import multirow_kernels

CONTEXT, REPEATS, LARGEST = 256, 5, 16


def main() -> None:
    runner = GgmlRunner(ensure_gguf("qwen2.5-coder-1.5b-instruct"), max_length=1024)
    runner.forward([(i * 7919) % 150000 for i in range(CONTEXT)], logits="none")
    times: dict[int, list[float]] = {}
    for repeat in range(REPEATS):
        for n in range(1, LARGEST + 1):
            tokens = [(n * 31 + i * 17) % 150000 for i in range(n)]
            start = time.perf_counter()
            runner.forward(tokens, logits="all")
            elapsed = time.perf_counter() - start
            runner.rollback(CONTEXT)
            if repeat:  # the first pass warms up
                times.setdefault(n, []).append(elapsed * 1e3)
    medians = [statistics.median(times[n]) for n in sorted(times)]
    print(f"multirow kernels: {multirow_kernels()}")
    print("T(n) ms:", " ".join(f"{t:.1f}" for t in medians))
    print("T(n)/T(1):", " ".join(f"{t / medians[0]:.2f}" for t in medians))


if __name__ == "__main__":
    main()
