"""Paired per-prompt differences in MAT (tokens per verify step) between the methods of one
`specpilot bench` run at batch 1, from its resumable per-run log (REPORT.runs.jsonl[.gz]):
for each pair of methods, the mean over prompts of (MAT_a − MAT_b), each prompt's MAT averaged
over its repeats, ± the standard error of that mean. At T > 0 two methods sample different
texts, so the pairing is by prompt, not by position.

    python scripts/ppow/paired_mat.py runs/ppow_bench/heldout_t1.json
"""

from __future__ import annotations

import gzip
import itertools
import json
import statistics
import sys
from pathlib import Path

from specpilot.bench.resume import runs_path
from specpilot.engine.stats import GenerationStats
from specpilot.types import StepRecord


def read_runs(report: Path) -> list[dict]:
    plain = runs_path(report)
    path = plain if plain.exists() else plain.with_name(plain.name + ".gz")  # as committed
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as lines:
        return [json.loads(line) for line in lines][1:]  # the first line is the run's key


def prompt_mats(entries: list[dict]) -> dict[str, list[float]]:
    """Method → each prompt's MAT (mean over its repeats of GenerationStats' MAT)."""
    mats: dict[str, list[float]] = {}
    for entry in entries:
        require_single(entry)
        for method, rows in entry["runs"].items():
            per_repeat = [mat(turns[0]["stats"]["records"]) for turns in rows[0]]
            mats.setdefault(method, []).append(statistics.fmean(per_repeat))
    return mats


def mat(records: list[dict]) -> float:
    stats = GenerationStats()
    for record in records:
        stats.add(StepRecord(**record))
    return stats.mean_accepted_tokens


def require_single(entry: dict) -> None:
    if len(entry["batch"]) != 1:
        size = len(entry["batch"])
        sys.exit(f"error: paired_mat reads batch-1 runs; this one has batches of {size}")


def short(method: str) -> str:
    if "head=" in method:
        return Path(method.split("head=")[1].split(",")[0]).parent.name
    initial = ("sd:drafter=eagle", "sd:drafter=eagle,policy=constant")
    return "initial" if method in initial else method


def main(path: str) -> None:
    mats = prompt_mats(read_runs(Path(path)))
    drafted = [m for m in mats if m != "ar"]
    print(f"{len(next(iter(mats.values())))} prompts")
    for method in drafted:
        print(f"MAT {short(method)}: {statistics.fmean(mats[method]):.3f}")
    for a, b in itertools.combinations(drafted, 2):
        diffs = [x - y for x, y in zip(mats[a], mats[b], strict=True)]
        error = statistics.stdev(diffs) / len(diffs) ** 0.5
        print(f"{short(a)} − {short(b)}: {statistics.fmean(diffs):+.3f} ± {error:.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
