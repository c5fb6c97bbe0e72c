"""How much can any chooser that reads the draft's scores gain over the best static tree? Hand-
written rules on a `train-ltd --out RUN` replay (BENCHMARKS-2026-11 §11.8), beside the best static
tree, LTD's policies and the hindsight ceiling (scripts/ltd/ceiling.py), on the validation split
and on all positions.

Each rule grows the tree a level at a time and stops at the first level that does not raise
max_V G(d, V) = (1 + Σ_{i≤V} a_i) / (T_draft(d) + T_verify(V + 1)), the a_i the forecast
acceptance of the tree's best V nodes (ranked as the drafter ranks them); it sees no level it
has not drafted (causal, as LTD's depth policy). Forecasts, fitted on the training split:
- `score`: a_i = c·exp(s_i), the node's cumulative draft probability times one calibration c
  (accepted over predicted at depth 3, V 14);
- `score, running`: c replaced by the prompt's own accepted over predicted of its last 16
  cycles (8 pseudo-cycles at the fitted c): the recent acceptance LTD's observations lack;
- `calibrated`: a_i from a table of the training split's acceptance by node depth × log-score
  bin (1/2-nat bins; 4 pseudo-counts at exp(s)), so that each depth's miscalibration is learned.

`--cells`: how much the draft's scores could buy at all. Positions are binned into k × k cells
by the best cumulative score of tree levels 1 and 2 (quantile bins), and every cell gets the one
(depth, V) that maximises the decoded tokens/s over its positions (`fit_cells`): fitted on the
training split and decoded on the validation split (what such a chooser would reach), and fitted
on the positions it is scored on (in-sample: optimistic for any chooser reading these two scores
at that resolution; as k grows it tends to the hindsight ceiling). With and without "draft
nothing" as a choice.

`--verify-slope S` replaces the cost model's verify curve by T(n) = T(1)·(1 + S·(n − 1)) and
`--draft-scale X` multiplies its draft times (what-ifs for a CPU where tokens are dear: float32
on an AVX2-only CPU is S ≈ 0.3-0.5).

    python scripts/ltd/score_rules.py RUN [--policies DIR] [--verify-slope S --draft-scale X]
        [--cells]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from specpilot.bench.hindsight import decoded_rate, hindsight_rate
from specpilot.policies.ltd_net import LtdNets, resolve_policies
from specpilot.training.ltd.config import LtdTrainConfig
from specpilot.training.ltd.cost import CostModel
from specpilot.training.ltd.envs import (
    Chooser,
    choice_outcomes,
    hindsight_throughput,
    plain_throughput,
    replay_throughput,
    static_grid,
)
from specpilot.training.ltd.replay import NO_RANK, ReplayLog, node_depths
from specpilot.training.ltd.trainer import split

BINS = np.arange(-12.0, 0.01, 0.5)
RECENT, PSEUDO_CYCLES, PSEUDO_COUNTS = 16, 8.0, 4.0
CELLS = (1, 2, 3, 4, 6, 8)


class Trees:
    """Each position's full tree ranked as the drafter ranks it: scores, node depths, and
    whether each node lies on the target's path."""

    def __init__(self, log: ReplayLog) -> None:
        shape = log.shape
        n = shape.candidates(shape.max_depth)
        depths = node_depths(shape)[:n]
        self.max_depth = shape.max_depth
        self.scores, self.depths, self.on_path = [], [], []
        for p in range(len(log)):
            scores = log.scores[p, :n]
            order = np.lexsort((np.arange(n), depths, -scores))
            ranks = log.path_ranks[p, shape.max_depth - 1]
            on_path = np.zeros(n, dtype=bool)
            on_path[ranks[ranks != NO_RANK]] = True
            self.scores.append(scores[order])
            self.depths.append(depths[order])
            self.on_path.append(on_path)


def fit_table(trees: Trees, limit: int = 64) -> np.ndarray:
    """Acceptance by node depth × log-score bin over the best `limit` nodes of each tree."""
    depth_count = int(max(d.max() for d in trees.depths)) + 1
    hits = np.zeros((depth_count, len(BINS) + 1))
    totals = np.zeros_like(hits)
    for scores, depths, on_path in zip(trees.scores, trees.depths, trees.on_path, strict=True):
        bins = np.digitize(scores[:limit], BINS)
        np.add.at(hits, (depths[:limit], bins), on_path[:limit])
        np.add.at(totals, (depths[:limit], bins), 1)
    middles = np.r_[BINS[0], (BINS[:-1] + BINS[1:]) / 2, 0.0]
    prior = np.minimum(1.0, np.exp(middles))[None, :]
    return (hits + PSEUDO_COUNTS * prior) / (totals + PSEUDO_COUNTS)


def decode(log, trees, cost, forecast, running, sizes, calibration) -> dict:
    """Replay tokens/s of the causal goodput rule with per-node forecasts `forecast(p)`."""
    tokens = ms = cycles = depth_sum = size_sum = 0
    for prompt in np.unique(log.prompt):
        positions = np.flatnonzero(log.prompt == prompt)
        p, last, history = int(positions[0]), int(positions[-1]), []
        while p <= last:
            scale = 1.0
            if running:
                predicted = sum(x for x, _ in history[-RECENT:]) + PSEUDO_CYCLES
                accepted = sum(y for _, y in history[-RECENT:]) + PSEUDO_CYCLES * calibration
                scale = accepted / predicted / calibration
            a, depths, context = forecast(p) * scale, trees.depths[p], int(log.context_len[p])
            best = None
            for d in range(1, log.shape.max_depth + 1):
                cumulative = np.cumsum(a[depths <= d])
                value, v = max(
                    ((1 + cumulative[v - 1]) / cost.cycle_ms(d, v, context), v)
                    for v in sizes
                    if v <= len(cumulative)
                )
                if best is not None and value <= best[0]:
                    break
                best = (value, d, v, cumulative[v - 1])
            _, d, v, predicted_tokens = best
            accepted_tokens = log.accepted(p, d, v)
            history.append((predicted_tokens, accepted_tokens))
            ms += cost.cycle_ms(d, v, context)
            tokens, cycles = tokens + accepted_tokens + 1, cycles + 1
            depth_sum, size_sum = depth_sum + d, size_sum + v
            p += accepted_tokens + 1
    return {"tokens_per_s": 1000 * tokens / ms, "depth": depth_sum / cycles,
            "size": size_sum / cycles}  # fmt: skip


def compare(log, cost, nets, best, sizes, rules: dict, label: str = "") -> dict:
    """`rules` (name → replay result) beside the best static tree, LTD's policies and the
    hindsight ceiling, printed as ratios to the best static tree."""
    static = Chooser(log, fixed_depth=best["depth"], fixed_size=best["size"])
    rows = {
        "best static": replay_throughput(log, cost, static),
        "LTD both": replay_throughput(log, cost, Chooser(log, nets.depth, nets.size)),
        **rules,
        "ceiling": hindsight_throughput(log, cost, range(1, log.shape.max_depth + 1), sizes),
    }
    base = rows["best static"]["tokens_per_s"]
    for key, row in rows.items():
        speed = row["tokens_per_s"]
        print(f"{label}{key:15} {speed:8.3f} tok/s {speed / base:6.3f}  "
              f"depth {row['depth']:.2f} V {row['size']:.1f}")  # fmt: skip
    return rows


def level_scores(trees: Trees) -> np.ndarray:
    """[positions, 2]: the best cumulative log-score of tree levels 1 and 2."""
    return np.array([[s[d == level].max() for level in (1, 2)]
                     for s, d in zip(trees.scores, trees.depths, strict=True)])  # fmt: skip


def cell_of(features: np.ndarray, edges: list[np.ndarray], k: int) -> np.ndarray:
    return np.digitize(features[:, 0], edges[0]) * k + np.digitize(features[:, 1], edges[1])


def fit_cells(tokens, ms, prompt, cells, n_cells) -> np.ndarray:
    """Each cell's choice, maximising the decoded rate Σ tokens / Σ ms over these positions:
    started from the better of the best static choice and Dinkelbach's per-cell optimum over
    positions as cycle starts, then each cell's choice improved in turn on the decoded
    trajectory until a sweep finds nothing better."""
    rows, rate, pick = np.arange(len(tokens)), 0.0, None
    for _ in range(100):
        per_cell = np.zeros((n_cells, tokens.shape[1]))
        np.add.at(per_cell, cells, tokens - rate * ms)
        candidate = per_cell.argmax(axis=1)
        chosen = candidate[cells]
        found = tokens[rows, chosen].sum() / ms[rows, chosen].sum()
        if pick is not None and found <= rate * (1 + 1e-12):
            break
        rate, pick = found, candidate

    def rate_of(pick: np.ndarray) -> float:
        return decoded_rate(tokens, ms, prompt, pick[cells])[0]

    statics = [np.full(n_cells, c) for c in range(tokens.shape[1])]
    pick = max([pick, *statics], key=rate_of)
    best, improved = rate_of(pick), True
    while improved:
        improved = False
        for cell in np.unique(cells):
            for choice in range(tokens.shape[1]):
                trial = pick.copy()
                trial[cell] = choice
                found = rate_of(trial)
                if found > best * (1 + 1e-9):
                    pick, best, improved = trial, found, True
    return pick


def cell_bounds(train: ReplayLog, valid: ReplayLog, log: ReplayLog, cost: CostModel) -> dict:
    """Rates of the k × k cell choosers (fit on train → valid; in-sample on all) over the one-cell
    chooser (the best static choice) of the same positions, beside the hindsight ceiling."""
    depths, sizes = range(1, log.shape.max_depth + 1), range(1, 16)
    parts = {"train": train, "valid": valid, "all": log}
    features = {name: level_scores(Trees(part)) for name, part in parts.items()}
    result = {}
    for skip in (False, True):
        label = "may draft nothing" if skip else "trees only"
        outcome = {name: choice_outcomes(part, cost, depths, sizes, skip)[1:]
                   for name, part in parts.items()}  # fmt: skip
        for fit, score in (("train", "valid"), ("all", "all")):
            tokens, ms = outcome[score]
            prompt, plain = parts[score].prompt, plain_throughput(parts[score], cost) / 1000
            rates = {}
            for k in CELLS:
                quantiles = np.linspace(0, 1, k + 1)[1:-1]
                edges = [np.quantile(features[fit][:, i], quantiles) for i in range(2)]
                cells = cell_of(features[fit], edges, k)
                pick = fit_cells(*outcome[fit], parts[fit].prompt, cells, k * k)
                chosen = pick[cell_of(features[score], edges, k)]
                rates[f"k={k}"] = decoded_rate(tokens, ms, prompt, chosen)[0]
            rates["ceiling"] = hindsight_rate(tokens, ms, prompt)[0]
            one_cell = rates["k=1"]
            for name, rate in rates.items():
                print(f"{label:17} fit {fit:5} score {score:5} {name:8} {1000 * rate:7.3f} tok/s"
                      f" {rate / one_cell:6.3f}× one cell {rate / plain:6.3f}× plain")  # fmt: skip
            result[f"{label}, fit {fit}, score {score}"] = {
                name: {"tokens_per_s": 1000 * rate, "over_one_cell": rate / one_cell,
                       "over_plain": rate / plain} for name, rate in rates.items()
            }  # fmt: skip
    return result


def what_if(cost: CostModel, slope: float, draft_scale: float) -> CostModel:
    sizes = list(range(1, 130))
    rows = [[cost.verify(1, c) * (1 + slope * (n - 1)) for n in sizes] for c in cost.contexts]
    draft = [ms * draft_scale for ms in cost.draft_ms]
    source = f"what-if slope {slope}, draft ×{draft_scale}"
    return CostModel(draft, cost.contexts, sizes, rows, source)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--policies", default=None)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--verify-slope", type=float, default=None)
    parser.add_argument("--draft-scale", type=float, default=1.0)
    parser.add_argument("--cells", action="store_true", help="the k × k cell choosers' bounds")
    args = parser.parse_args()
    nets = LtdNets.load(resolve_policies(args.policies, args.target))
    log = ReplayLog.load(args.run / "replay", nets.shape)
    cost = CostModel.load(args.run / "cost.json")
    if args.verify_slope is not None:
        cost = what_if(cost, args.verify_slope, args.draft_scale)
    config = LtdTrainConfig()
    train, valid = split(log, config.valid_fraction, config.seed)
    train_trees = Trees(train)
    table = fit_table(train_trees)
    cut = [np.flatnonzero(d <= 3)[:14] for d in train_trees.depths]
    predicted = sum(np.exp(s[i]).sum() for s, i in zip(train_trees.scores, cut, strict=True))
    calibration = sum(train.accepted(p, 3, 14) for p in range(len(train))) / predicted
    best = max(static_grid(train, cost), key=lambda row: row["tokens_per_s"])
    sizes = range(1, 49)
    result = {"cost_model": cost.source, "calibration": float(calibration),
              "best_static": [best["depth"], best["size"]]}  # fmt: skip
    print(f"{cost.source}; c = {calibration:.3f}; best static on train: depth {best['depth']}, "
          f"V {best['size']}")  # fmt: skip
    for name, part in (("valid", valid), ("all", log)):
        trees = Trees(part)
        score = lambda p, t=trees: calibration * np.exp(t.scores[p])  # noqa: E731
        table_of = lambda p, t=trees: table[t.depths[p], np.digitize(t.scores[p], BINS)]  # noqa: E731
        rules = {
            "score": decode(part, trees, cost, score, False, sizes, calibration),
            "score, running": decode(part, trees, cost, score, True, sizes, calibration),
            "calibrated": decode(part, trees, cost, table_of, False, sizes, calibration),
        }
        result[name] = compare(part, cost, nets, best, sizes, rules, label=f"{name:5} ")
    if args.cells:
        result["cells"] = cell_bounds(train, valid, log, cost)
    suffix = "" if args.verify_slope is None else f"_slope{args.verify_slope}"
    (args.run / f"score_rules{suffix}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
