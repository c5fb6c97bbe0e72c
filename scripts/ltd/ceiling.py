"""LTD's headroom on a `train-ltd --out RUN` replay (BENCHMARKS-2026-11 §11.5): train-ltd's replay
summary (trainer.replay_summary: the best static tree of the training positions, the EAGLE-2
default, the run's policies (else the target's committed ones, when their tree shape matches the
run's) and each use's hindsight ceiling) on its validation split and on all positions, plus plain
decoding and three more ceilings (depth 1..max with sizes 1-32 added to the size grid; the same
with "draft nothing" as a choice; depth alone at the best static V); prints a table and writes
RUN/ceiling.json. Ratios are over the best static tree.

    python scripts/ltd/ceiling.py RUN [TARGET]
"""

import json
import sys
from dataclasses import asdict
from pathlib import Path

from specpilot.policies.ltd_net import LtdNets, LtdShape, resolve_policies
from specpilot.training.ltd.config import LtdTrainConfig
from specpilot.training.ltd.cost import CostModel
from specpilot.training.ltd.envs import hindsight_throughput, plain_throughput
from specpilot.training.ltd.replay import ReplayLog
from specpilot.training.ltd.trainer import replay_summary, split

out = Path(sys.argv[1])
target = sys.argv[2] if len(sys.argv) > 2 else "qwen2.5-coder-1.5b-instruct"
config = LtdTrainConfig()
recorded = json.loads((out / "train_config.json").read_text())
shape = LtdShape(*(recorded[k] for k in ("topk", "max_depth", "size_step", "size_actions")))
own = out / "policies"
policies = resolve_policies(own if own.is_dir() else None, target)
nets = LtdNets.load(policies)
matches = nets.shape == shape
pair = {"depth": nets.depth if matches else None, "size": nets.size if matches else None}
log = ReplayLog.load(out / "replay", shape)
cost = CostModel.load(out / "cost.json")
train, valid = split(log, config.valid_fraction, config.seed)
depths = range(1, shape.max_depth + 1)
fine = sorted(set(range(1, 33)) | {shape.size_of(a) for a in range(shape.size_actions)})
result = {"shape": asdict(shape), "policies": str(policies) if matches else None}
for name, part in (("valid", valid), ("all", log)):
    summary = replay_summary(train, part, cost, config, [], pair)
    best = summary["static"]["best_static"]
    rows = {"plain": {"tokens_per_s": plain_throughput(part, cost), "depth": 0, "size": 0,
                      "accepted": 0.0, "cycles": len(part)}}  # fmt: skip
    rows |= {f"static_{k}": v for k, v in summary["static"].items()}
    rows |= {f"policies_{k}": v for k, v in summary["ltd"].items()}
    rows |= {f"ceiling_{k}": v for k, v in summary["hindsight"].items()}
    rows["ceiling_both_fine"] = hindsight_throughput(part, cost, depths, fine)
    rows["ceiling_both_fine_skip"] = hindsight_throughput(part, cost, depths, fine, skip=True)
    rows["ceiling_depth_best_v"] = hindsight_throughput(part, cost, depths, [best["size"]])
    result[name] = {"positions": summary["positions"], "rows": rows}
    for key, row in rows.items():
        ratio = row["tokens_per_s"] / best["tokens_per_s"]
        print(
            f"{name:5} {key:24} {row['tokens_per_s']:7.3f} tok/s  {ratio:6.3f}  "
            f"depth {row['depth']:.2f} V {row['size']:.1f} acc {row['accepted']:.2f} "
            f"cycles {row['cycles']}"
        )
(out / "ceiling.json").write_text(json.dumps(result, indent=1) + "\n")
