"""Markdown tables of a `specpilot bench` JSON report for BENCHMARKS-2026-11 §8: speedup and MAT per
category, acceptance by draft depth, and the draft's cost per step as a fraction of a plain
target step: python scripts/eagle/bench_table.py REPORT.json

Draft cost: the bench's timings are those of the first repeat, so a method's steps are its first
repeat's tokens over its MAT, and a plain step is `ar`'s target time per token. Acceptance by
depth i: P(N >= i | N >= i - 1) for N the tokens a step accepted (from its histogram; a lower
bound where steps draft fewer than i tokens, as SVIP's do)."""

import json
import sys
from collections import defaultdict


def conditional(histogram: list[int]) -> list[float]:
    reached = [sum(histogram[i:]) for i in range(len(histogram))]
    return [reached[i] / reached[i - 1] for i in range(1, len(reached)) if reached[i - 1]]


def main(path: str) -> None:
    rows = json.loads(open(path).read())["results"]
    by_method: dict[str, dict[str, dict]] = defaultdict(dict)
    for row in rows:
        by_method[row["method"]][row["category"]] = row
    categories = [c for c in next(iter(by_method.values())) if c != "all"] + ["all"]
    print("| method | " + " | ".join(categories) + " |")
    print("|---|" + "---:|" * len(categories))
    for method, cells in by_method.items():
        texts = []
        for category in categories:
            row = cells[category]
            mat = "" if method == "ar" else f" (MAT {row['mean_accepted_tokens']:.2f})"
            texts.append(f"{row['speedup']:.2f}×{mat}")
        print(f"| {method} | " + " | ".join(texts) + " |")
    plain = by_method["ar"]["all"]
    plain_ms = 1000 * plain["verify_s"] / plain["new_tokens"]
    print(f"\nplain step {plain_ms:.1f} ms (ar, all prompts)\n")
    print("| method (all prompts) | tok/s | draft ms / step | c = draft / plain step "
          "| nodes / step | acceptance by depth 1, 2, 3, … | mismatches (bf16) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---|---:|")
    for method, cells in by_method.items():
        row = cells["all"]
        if method == "ar":
            continue
        steps = row["new_tokens"] / row["mean_accepted_tokens"]
        draft_ms = 1000 * row["draft_s"] / steps
        depth = ", ".join(f"{a:.2f}" for a in conditional(row["accepted_histogram"])[:8])
        print(
            f"| {method} | {row['tokens_per_s']:.2f} | {draft_ms:.1f} | {draft_ms / plain_ms:.3f} "
            f"| {row['mean_verify_nodes']:.1f} | {depth} | {row['greedy_mismatches']} |"
        )


if __name__ == "__main__":
    main(sys.argv[1])
