"""What the goodput controller saw when it planned each step (BENCHMARKS §10.29).

`run` is `specpilot bench` with every plan of the controller appended to TRACE (jsonl): the
long-run and recent batch-wide first-position acceptance, each row's forecast of its first
position (None at its request's first step) and running target confidence, whether it has
drafted yet, the idle steps before the plan, the budgets and each row's remaining tokens.
`show` prints one batch of prompts of a trace (batches counted from 0, the warm-up excluded),
a line per step; `bins` prints, from a bench's run log, the controller's drafting steps'
first-position acceptance by the row's running target confidence (as the controller's
calibration bins it: 0.75 kept per step).

    TRACE=FILE python docs/bench/goodput/trace_plans.py run BENCH-ARGS...
    python docs/bench/goodput/trace_plans.py show FILE BATCH
    python docs/bench/goodput/trace_plans.py bins RUNS.jsonl[.gz]
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import sys

from specpilot.cli import main as cli
from specpilot.policies import controller

CONTROLLER = "sd:policy=goodput"


def traced(plan, out):
    def plan_and_log(self, policies, caps, remaining=None):
        seen = {}
        if self.verify.points():
            depth = max(max(caps), 1)
            long_run = self.long_run.estimates(depth, None, self.strength)
            recent = self.acceptance.estimates(depth, long_run, self.strength)
            seen = {
                "long_run": long_run[0],
                "recent": recent[0],
                "rows": [
                    [
                        None if p.opening else p.forecast(self.row_prior(recent, p))[0],
                        p.target_confidence,
                        p.drafted_ever,
                    ]
                    for p in policies
                ],
                "idle": self.idle,
            }
        budgets = plan(self, policies, caps, remaining)
        out.write(json.dumps({**seen, "budgets": budgets, "remaining": remaining}) + "\n")
        out.flush()
        return budgets

    return plan_and_log


def show(path: str, batch: int) -> None:
    with open(path) as f:
        plans = [json.loads(line) for line in f]
    starts = [  # a batch's first step: every row at its request's first step (the warm-up's
        i  # came before any step was timed: no rows)
        for i, p in enumerate(plans)
        if p.get("rows") and all(row[0] is None for row in p["rows"])
    ]
    end = starts[batch + 1] if batch + 1 < len(starts) else len(plans)
    for step, p in enumerate(plans[starts[batch] : end]):
        rows = " ".join(
            ("  -  " if a is None else f"{a:.2f}") + "/" + ("  -  " if c is None else f"{c:.2f}")
            + ("d" if drafted else " ")
            for a, c, drafted in p["rows"]
        )  # fmt: skip
        print(f"{step:3d} long-run {p['long_run']:.2f} recent {p['recent']:.2f} | {rows} | "
              f"budgets {p['budgets']} idle {p['idle']} remaining {p['remaining']}")  # fmt: skip


def bins(path: str) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        batches = [json.loads(line) for line in f][1:]  # the first line is the run's key
    counts = collections.defaultdict(lambda: [0, 0])
    for batch in batches:
        for row in batch["runs"][CONTROLLER]:
            for repeat in row:
                running = None
                for step, record in enumerate(repeat[0]["stats"]["records"]):
                    if step > 1 and record["num_verified"] and running is not None:
                        counts[min(int(running * 10), 9)][0] += 1
                        counts[min(int(running * 10), 9)][1] += record["num_accepted"] > 0
                    seen = record["target_confidence"]
                    if seen is not None:
                        keep = controller.TARGET_CONFIDENCE_MEMORY
                        running = seen if running is None else keep * running + (1 - keep) * seen
    for b in sorted(counts):
        tested, accepted = counts[b]
        print(f"running confidence [{b / 10:.1f}, {(b + 1) / 10:.1f}): {tested} drafting steps, "
              f"first position accepted {accepted / tested:.2f}")  # fmt: skip


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "run":
        with open(os.environ["TRACE"], "a") as trace:
            controller.GoodputController.plan = traced(controller.GoodputController.plan, trace)
            sys.exit(cli(args))
    elif command == "show":
        show(args[0], int(args[1]))
    else:
        bins(args[0])
