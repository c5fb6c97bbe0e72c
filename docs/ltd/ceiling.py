"""LTD's headroom on a `train-ltd --out RUN` replay (BENCHMARKS §11.5): the best static tree of
the training positions, the committed policies of the target, and the hindsight ceilings
(training/ltd/envs.hindsight_throughput) for several choice sets, on train-ltd's validation
split and on all positions; prints a table and writes RUN/ceiling.json.

    python docs/ltd/ceiling.py RUN [TARGET]
"""

import json
import sys
import time
from pathlib import Path

from specpilot.drafting.dynamic_tree import DEFAULT_DEPTH, DEFAULT_NODES
from specpilot.policies.ltd_net import LtdNets, resolve_policies
from specpilot.training.ltd.config import LtdTrainConfig
from specpilot.training.ltd.cost import CostModel
from specpilot.training.ltd.envs import (
    Chooser,
    hindsight_throughput,
    replay_throughput,
    static_grid,
)
from specpilot.training.ltd.replay import ReplayLog
from specpilot.training.ltd.trainer import split

out = Path(sys.argv[1])
cfg = LtdTrainConfig()
target = sys.argv[2] if len(sys.argv) > 2 else "qwen2.5-coder-1.5b-instruct"
nets = LtdNets.load(resolve_policies(None, target))
shape = nets.shape
log = ReplayLog.load(out / "replay", shape)
cost = CostModel.load(out / "cost.json")
train, valid = split(log, cfg.valid_fraction, cfg.seed)
grid = static_grid(train, cost)
best = max(grid, key=lambda r: r["tokens_per_s"])
depths = range(1, shape.max_depth + 1)
actions = [shape.size_of(a) for a in range(shape.size_actions)]
fine = sorted(set(range(1, 33)) | set(actions))
result = {
    "shape": [shape.topk, shape.max_depth, shape.size_step, shape.size_actions],
    "positions": {"all": len(log), "train": len(train), "valid": len(valid)},
    "best_static_on_train": {"depth": best["depth"], "size": best["size"]},
}
for name, part in (("valid", valid), ("all", log)):
    t0 = time.time()
    row = {}
    row["best_static"] = replay_throughput(
        part, cost, Chooser(part, fixed_depth=best["depth"], fixed_size=best["size"])
    )
    row["default_3_8"] = replay_throughput(
        part, cost, Chooser(part, fixed_depth=DEFAULT_DEPTH, fixed_size=DEFAULT_NODES)
    )
    for use, (dn, sn) in {
        "both": (nets.depth, nets.size),
        "depth": (nets.depth, None),
        "size": (None, nets.size),
    }.items():
        row[f"committed_{use}"] = replay_throughput(
            part,
            cost,
            Chooser(
                part,
                dn,
                sn,
                fixed_depth=DEFAULT_DEPTH,
                fixed_size=DEFAULT_NODES,
                check_every=cfg.check_every,
            ),
        )
    row["ceiling_both_grid"] = hindsight_throughput(part, cost, depths, actions)
    row["ceiling_depth_v8"] = hindsight_throughput(part, cost, depths, [DEFAULT_NODES])
    row["ceiling_size_grid_d3"] = hindsight_throughput(part, cost, [DEFAULT_DEPTH], actions)
    row["ceiling_both_fine"] = hindsight_throughput(part, cost, depths, fine)
    row["ceiling_depth_best_v"] = hindsight_throughput(part, cost, depths, [best["size"]])
    row["seconds"] = time.time() - t0
    result[name] = row
    base = row["best_static"]["tokens_per_s"]
    for k, v in row.items():
        if isinstance(v, dict):
            ratio = v["tokens_per_s"] / base
            print(
                f"{name:5} {k:22} {v['tokens_per_s']:7.3f} tok/s  {ratio:6.3f}  "
                f"depth {v['depth']:.2f} V {v['size']:.1f} acc {v['accepted']:.2f} "
                f"cycles {v['cycles']}"
            )
Path(out / "ceiling.json").write_text(json.dumps(result, indent=1) + "\n")
