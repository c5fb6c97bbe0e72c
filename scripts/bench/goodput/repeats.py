"""Where a batch bench's controller gained or lost, per batch of prompts and repeat (the medians of
batch_table.py hide which batch and repeat it was). From a run log of
scripts/bench/goodput_batches.sh:

- per batch, each method's speed over plain decoding's in the same repeat (batch wall time, the
  slowest row's `total_s`), one number per repeat;
- per batch, the median target forward of steps where no row drafted, plain decoding against the
  controller (what idle steps cost it beyond plain decoding's);
- per batch and repeat, plain decoding's and the controller's seconds split into the prompt read,
  target forwards, drafting and the rest (the draft model's reads of prompts and accepted tokens
  when rows start or resume, planning, commits; from the first row's records);
- over every batch and repeat, each method's paired speed over plain decoding, and the
  controller's over each other method: the geometric mean of the per-(batch, repeat) ratios
  with its 95 % interval (t on the log ratios; the two runs of a pair ran back to back, so the
  host's drift between repeats cancels, unlike in medians of repeats), and the ratio of summed
  wall times; for the controller over plain decoding also apart over the pairs where it
  drafted nothing (what watching costs) and where it drafted (probes and plans);
- with `--steps`, the controller's steps of each batch and repeat: per row a character per step
  (its accepted count where it drafted, `.` where it did not), then each step's draft ms.

    python scripts/bench/goodput/repeats.py RUNS.jsonl[.gz] [--steps]
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import sys
from collections.abc import Callable

from scipy import stats as scipy_stats

BASELINE, CONTROLLER = "ar", "sd:policy=goodput"


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f][1:]  # the first line is the run's key


def runs(rows: list, repeat: int) -> list[dict]:
    """Each row's stats in one repeat (first turn)."""
    return [row[repeat][0]["stats"] for row in rows]


def wall(rows: list, repeat: int) -> float:
    return max(stats["total_s"] for stats in runs(rows, repeat))


def idle_forward_ms(rows: list) -> tuple[float, int]:
    """Median target forward (ms) of steps where no row drafted, after each request's first."""
    seconds = []
    for repeat in range(len(rows[0])):
        records = [stats["records"] for stats in runs(rows, repeat)]
        for i in range(1, min(len(r) for r in records)):
            if not any(r[i]["num_drafted"] for r in records):
                seconds.append(records[0][i]["verify_s"])
    return (1000 * statistics.median(seconds) if seconds else float("nan")), len(seconds)


def split(rows: list, repeat: int) -> str:
    """A repeat's wall time (the slowest row's) as the first row's prompt read, target forwards,
    drafting and the rest."""
    stats = runs(rows, repeat)[0]
    total = wall(rows, repeat)
    forward = sum(r["verify_s"] for r in stats["records"])
    draft = sum(r["draft_s"] for r in stats["records"])
    rest = total - stats["prefill_s"] - forward - draft
    return (f"{total:.2f} s = read {stats['prefill_s']:.2f} + forwards {forward:.2f} + draft "
            f"{draft:.2f} + rest {rest:.3f}")  # fmt: skip


def print_steps(rows: list) -> None:
    for repeat in range(len(rows[0])):
        print(f"  repeat {repeat}: {wall(rows, repeat):.2f} s")
        records = [stats["records"] for stats in runs(rows, repeat)]
        for row in records:
            print("   ", "".join(str(r["num_accepted"]) if r["num_verified"] else "." for r in row))
        steps = max(len(row) for row in records)
        draft_ms = [
            round(1000 * max((row[i]["draft_s"] for row in records if i < len(row)), default=0))
            for i in range(steps)
        ]
        print("    draft ms", " ".join(map(str, draft_ms)))


def drafted(rows: list, repeat: int) -> bool:
    """Whether any row drafted on any step of this repeat (a probe included)."""
    return any(record["num_drafted"] for stats in runs(rows, repeat) for record in stats["records"])


def paired(
    batches: list[dict], base: str, name: str, when: Callable[[list, int], bool] | None = None
) -> str:
    """`name`'s speed over `base`'s, paired per batch and repeat: the geometric mean of the
    ratios with its 95 % interval (t on the log ratios), and the ratio of summed wall times;
    over the pairs `when(name's rows, repeat)` holds for, if given."""
    pairs = [
        (wall(batch["runs"][base], r), wall(batch["runs"][name], r))
        for batch in batches
        for r in range(len(batch["runs"][base][0]))
        if when is None or when(batch["runs"][name], r)
    ]
    if not pairs:
        return f"{name.removeprefix('sd:')} over {base.removeprefix('sd:')}: no such pairs"
    logs = [math.log(b / n) for b, n in pairs]
    mean = statistics.fmean(logs)
    half = math.nan
    if len(logs) > 1:
        half = scipy_stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs)
        half /= math.sqrt(len(logs))
    summed = sum(b for b, _ in pairs) / sum(n for _, n in pairs)
    return (f"{name.removeprefix('sd:')} over {base.removeprefix('sd:')}: paired "
            f"{math.exp(mean):.3f} [{math.exp(mean - half):.3f}, {math.exp(mean + half):.3f}] "
            f"over {len(pairs)} batch-repeats; summed walls {summed:.3f}")  # fmt: skip


def idle(rows: list, repeat: int) -> bool:
    """Whether no row drafted on any step of this repeat: the controller only watched."""
    return not drafted(rows, repeat)


def paired_summary(batches: list[dict]) -> None:
    """Each method over plain decoding, and the controller over each other method."""
    names = list(batches[0]["runs"])
    for name in names:
        if name != BASELINE:
            print(paired(batches, BASELINE, name))
    if CONTROLLER in names:
        print("  where it drafted nothing:", paired(batches, BASELINE, CONTROLLER, when=idle))
        print("  where it drafted:", paired(batches, BASELINE, CONTROLLER, when=drafted))
        for name in names:
            if name not in (BASELINE, CONTROLLER):
                print(paired(batches, name, CONTROLLER))


def main(path: str, steps: bool) -> None:
    batches = load(path)
    for batch in batches:
        methods = batch["runs"]
        base = methods[BASELINE]
        speeds = []
        for name, rows in methods.items():
            ratios = " ".join(f"{wall(base, r) / wall(rows, r):.3f}" for r in range(len(rows[0])))
            speeds.append(f"{name.removeprefix('sd:')} {ratios}")
        print(f"prompts {batch['batch'][0]}–{batch['batch'][-1]}: " + " | ".join(speeds))
        if CONTROLLER in methods:
            plain, controller = idle_forward_ms(base), idle_forward_ms(methods[CONTROLLER])
            print(f"  idle target forward: ar {plain[0]:.1f} ms ({plain[1]} steps), "
                  f"controller {controller[0]:.1f} ms ({controller[1]} steps)")  # fmt: skip
            for r in range(len(base[0])):
                print(f"  repeat {r}: ar {split(base, r)} | controller "
                      f"{split(methods[CONTROLLER], r)}")  # fmt: skip
            if steps:
                print_steps(methods[CONTROLLER])
    paired_summary(batches)


if __name__ == "__main__":
    main(sys.argv[1], "--steps" in sys.argv[2:])
