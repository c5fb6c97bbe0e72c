"""What the goodput controller saw when it planned each step (BENCHMARKS §10.29).

`run` is `specpilot bench` with every plan of the controller appended to TRACE (jsonl): the
long-run and recent batch-wide first-position acceptance, each row's forecast of its first
position (None at its request's first step) and running target confidence, whether it has
drafted yet, the idle steps before the plan, the budgets and each row's remaining tokens.
`show` prints one batch of prompts of a trace (batches counted from 0, the warm-up excluded),
a line per step; `bins` prints, from a bench's run log, the controller's drafting steps'
first-position acceptance by the row's running target confidence (as the controller keeps and
bins it).

    TRACE=FILE python scripts/bench/goodput/trace_plans.py run BENCH-ARGS...
    python scripts/bench/goodput/trace_plans.py show FILE BATCH
    python scripts/bench/goodput/trace_plans.py bins RUNS.jsonl[.gz]
"""

from __future__ import annotations

import gzip
import json
import os
import sys

from specpilot.cli import main as cli
from specpilot.policies import controller
from specpilot.types import StepRecord

CONTROLLER = "sd:policy=goodput"


def traced(out):
    """An observer (GoodputController.plan_observers) that appends each plan to `out`, with
    what its forecasts were made from (where the plan forecast: some row could draft)."""

    def log(planner: controller.GoodputController, note: controller.PlanNote) -> None:
        seen: dict = {}
        if note.forecasts is not None:
            batch = planner.batch
            long_run = batch.long_run.estimates(1, None, batch.strength)
            seen = dict(
                long_run=long_run[0],
                recent=batch.recent.estimates(1, long_run, batch.strength)[0],
                rows=[
                    [
                        None if p.opening or not forecast else forecast[0],
                        p.target_confidence,
                        p.drafted_ever,
                    ]
                    for p, forecast in zip(note.policies, note.forecasts, strict=True)
                ],
                idle=note.idle,
            )
        out.write(json.dumps({**seen, "budgets": note.budgets, "remaining": note.remaining}))
        out.write("\n")
        out.flush()

    return log


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
        if "rows" not in p:  # no row could draft (no room left): plain without a plan
            print(f"{step:3d} budgets {p['budgets']} remaining {p['remaining']}")
            continue
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
    counts = controller.ConfidenceCalibration(memory=1.0)  # unweighted: plain counts
    for batch in batches:
        for row in batch["runs"][CONTROLLER]:
            for repeat in row:
                policy = controller.GoodputPolicy()  # keeps the running confidence as planned
                for step in repeat[0]["stats"]["records"]:
                    running = policy.target_confidence
                    if not policy.opening and step["num_verified"] and running is not None:
                        counts.add(running, step["num_accepted"] > 0)
                    policy.observe(StepRecord(**step))
    for b, (tested, accepted) in enumerate(zip(counts.tested, counts.accepted, strict=True)):
        if tested:
            print(f"running confidence [{b / counts.bins:.1f}, {(b + 1) / counts.bins:.1f}): "
                  f"{tested:.0f} drafting steps, first position accepted "
                  f"{accepted / tested:.2f}")  # fmt: skip


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "run":
        with open(os.environ["TRACE"], "a") as trace:
            observer = traced(trace)
            init = controller.GoodputController.__init__

            def observed(self, *given, **options):  # every controller the bench builds
                init(self, *given, **options)
                self.plan_observers.append(observer)

            controller.GoodputController.__init__ = observed
            sys.exit(cli(["bench", *args]))
    elif command == "show":
        show(args[0], int(args[1]))
    else:
        bins(args[0])
