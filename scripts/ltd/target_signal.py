"""Does the target's own confidence tell LTD more than the draft's scores?
(BENCHMARKS-2026-11 §11.10)

§11.8 found that every chooser reading the draft's scores gains +2–4 % over the best static tree
on replay while a chooser that knew each cycle's outcome gains +14–25 %, and named the target's
confidence as the untried signal. A cycle that starts after token x_t can see, for free, the
target's distributions that produced x_t, x_{t−1}, … (the last verify pass computed them). This
script asks how much they add, on a `train-ltd --out RUN` replay:

1. one teacher-forced target forward per recorded prompt gives, at every position, the target's
   top-1 probability and entropy on the tokens it just committed (and, for the correlations of
   `correlations` and the non-causal bound below, on the next ones);
2. three per-node acceptance models (a small MLP on the top 64 nodes of each tree, cross-fitted
   in 5 folds by prompt so that every position is forecast by a model that never saw its prompt):
   `draft` reads the node's cumulative score, its depth and its rank;
   `draft + target, past` also reads the target's confidence on the last four committed tokens
   (what a chooser can see); `draft + target, next tokens` reads it on the next four instead, a
   non-causal bound on what any target-side observation could add;
3. each model's forecasts drive §11.8's causal goodput rule (grow a level at a time, stop at the
   first level that does not raise max_V (1 + Σ a_i) / (T_draft(d) + T_verify(V + 1))), and the
   replay throughput is compared with the best static tree, LTD's policies and the hindsight
   ceiling;
4. the depth alone, chosen up front (after the first level) at a fixed V = 15 (one verify
   block of this CPU, where the size choice is worth nothing, §11.9): an MLP regression of the
   accepted length at each depth 1–8 from the first level's scores, the context length and each
   target signal, cross-fitted the same way, against every static depth and the hindsight depth.

    python scripts/ltd/target_signal.py RUN [--policies DIR]     # writes RUN/target_signal.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file

sys.path.insert(0, str(Path(__file__).parent))
from score_rules import Trees, compare, decode  # noqa: E402

from specpilot.api import load_models  # noqa: E402
from specpilot.models.chat import encode_prompt  # noqa: E402
from specpilot.policies.ltd_net import LtdNets, resolve_policies  # noqa: E402
from specpilot.training.eagle.data import DataOptions, training_prompts  # noqa: E402
from specpilot.training.ltd.cost import CostModel  # noqa: E402
from specpilot.training.ltd.envs import static_grid  # noqa: E402
from specpilot.training.ltd.replay import ReplayLog  # noqa: E402

HISTORY, TOP, FOLDS = 4, 64, 5
BLOCK_V, UPFRONT_DEPTHS = 15, 8
OFFSETS = range(-HISTORY, HISTORY)
"""Distributions read around a cycle at x_t: offset −1 gave x_t (the newest the cycle can see),
0 gives x_{t+1} (what the target will say of the first drafted token; not visible to a chooser)."""


def answers(run: Path) -> list[tuple[str, list[int]]]:
    """(prompt id, the target's greedy answer as recorded) per recorded prompt, in log order."""
    out = []
    for path in sorted((run / "replay").glob("shard-*.safetensors")):
        with safe_open(str(path), "np") as f:
            ids = json.loads(f.metadata()["prompts"])
        data = load_file(str(path))
        starts = np.flatnonzero(data["step"] == 0)
        assert len(starts) == len(ids), f"{path}: a prompt with no positions"
        for pid, lo, hi in zip(ids, starts, [*starts[1:], len(data["step"])], strict=True):
            cont = data["cont"][lo:hi]
            tail = [int(x) for x in cont[-1, 1:] if x >= 0]
            out.append((pid, [int(x) for x in cont[:, 0]] + tail))
    return out


def target_confidence(run: Path, target_name: str, log: ReplayLog) -> np.ndarray:
    """[positions, OFFSETS, 2]: top-1 probability and entropy of the target's distribution after
    x_{t+1+k} for each offset k (so k = −1 is the one that produced x_t); cached in RUN."""
    cache = run / "target_confidence.npy"
    if cache.is_file():
        return np.load(cache)
    config = json.loads((run / "train_config.json").read_text())
    prompts = dict(
        training_prompts(
            DataOptions(
                data_dir=config["data_dir"],
                max_prompts=max(config["prompts"], 1),
                max_prompt_tokens=config["max_prompt_tokens"],
            )  # fmt: skip
        )
    )
    models = load_models(target_name, None, config["dtype"], max_length=config["max_length"])
    runner, tokenizer = models.target.runner, models.target.tokenizer
    features = []
    for index, (pid, answer) in enumerate(answers(run)):
        prompt = encode_prompt(tokenizer, prompts[pid])
        full = prompt + answer
        runner.reset()
        with torch.no_grad():
            logits = runner.run_batch([full], [0], logits="all")[0].logits.float()
        logp = torch.log_softmax(logits, dim=-1)
        top1 = logp.max(dim=-1).values.exp().numpy()  # [i]: the distribution after full[: i + 1]
        entropy = -(logp.exp() * logp).sum(-1).numpy()
        for t in range(len(prompt) - 1, len(prompt) - 1 + int((log.prompt == index).sum())):
            around = [min(t + k, len(full) - 1) for k in OFFSETS]  # an answer may end early
            features.append(np.stack([top1[around], entropy[around]], axis=-1))
        greedy = logp[len(prompt) - 1 : -1].argmax(-1).numpy() == np.asarray(answer)
        print(f"{pid}: {len(full)} tokens, the answer is the target's argmax at "
              f"{greedy.mean():.1%} of its positions", file=sys.stderr)  # fmt: skip
    array = np.asarray(features, np.float32)
    assert len(array) == len(log), (len(array), len(log))
    np.save(cache, array)
    return array


def node_features(trees: Trees, p: int, target: np.ndarray | None) -> np.ndarray:
    """[nodes, k] features of position p's tree, in the drafter's rank order."""
    scores, depths = trees.scores[p], trees.depths[p]
    n = len(scores)
    one_hot = np.eye(trees.max_depth + 1, dtype=np.float32)[depths][:, 1:]
    columns = [scores[:, None], one_hot,
               np.log1p(np.arange(n, dtype=np.float32))[:, None] / 7]  # fmt: skip
    if target is not None:
        columns.append(np.broadcast_to(target[p], (n, len(target[p]))))
    return np.concatenate(columns, axis=1).astype(np.float32)


def fit(trees: Trees, positions: np.ndarray, target, seed: int) -> torch.nn.Module:
    """A 2×64 ReLU MLP of P(node on the target's path) over the top TOP nodes of each tree."""
    x = np.concatenate([node_features(trees, p, target)[:TOP] for p in positions])
    y = np.concatenate([trees.on_path[p][:TOP] for p in positions]).astype(np.float32)
    torch.manual_seed(seed)
    net = mlp(x.shape[1], 1)
    generator = torch.Generator().manual_seed(seed)
    bce = lambda out, y: torch.nn.functional.binary_cross_entropy_with_logits(out.squeeze(-1), y)  # noqa: E731
    return train(net, x, y, bce, epochs=4, batch_size=1024, generator=generator)


def mlp(inputs: int, outputs: int) -> torch.nn.Module:
    """The 2×64 ReLU MLP both forecasters use."""
    return torch.nn.Sequential(
        torch.nn.Linear(inputs, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, outputs),
    )  # fmt: skip


def train(net, x: np.ndarray, y: np.ndarray, loss_of, epochs: int, batch_size: int,
          generator: torch.Generator | None = None) -> torch.nn.Module:  # fmt: skip
    """Adam (lr 2e-3) on shuffled minibatches; `loss_of(net output, labels)`."""
    optimizer = torch.optim.Adam(net.parameters(), lr=2e-3)
    x, y = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(batch_size):
            loss = loss_of(net(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return net.eval()


def folds(log: ReplayLog):
    """(fold, held-out mask) for FOLDS folds of the prompts."""
    prompts = np.random.default_rng(0).permutation(np.unique(log.prompt))
    for fold in range(FOLDS):
        yield fold, np.isin(log.prompt, prompts[fold::FOLDS])


def cross_fit(log: ReplayLog, trees: Trees, target) -> tuple[list[np.ndarray], float]:
    """Out-of-fold node forecasts for every position (folds by prompt) and their mean log loss
    over the top TOP nodes."""
    forecasts: list[np.ndarray] = [np.empty(0)] * len(log)
    losses = []
    for fold, held in folds(log):
        net = fit(trees, np.flatnonzero(~held), target, seed=fold)
        with torch.no_grad():
            for p in np.flatnonzero(held):
                logit = net(torch.from_numpy(node_features(trees, p, target))).squeeze(-1)
                forecasts[p] = torch.sigmoid(logit).numpy()
                y = torch.from_numpy(trees.on_path[p][:TOP].astype(np.float32))
                losses.append(float(torch.nn.functional.binary_cross_entropy_with_logits(
                    logit[:TOP], y)))  # fmt: skip
    return forecasts, float(np.mean(losses))


def walk(log: ReplayLog, cost: CostModel, accepted: np.ndarray, choose) -> dict:
    """Replay tokens/s at V = BLOCK_V when `choose(p)` picks each cycle's depth;
    `accepted[p, d − 1]` is what depth d accepts at position p."""
    tokens = ms = 0.0
    depths = []
    for prompt in np.unique(log.prompt):
        positions = np.flatnonzero(log.prompt == prompt)
        p, last = int(positions[0]), int(positions[-1])
        while p <= last:
            depth = choose(p)
            gained = int(accepted[p, depth - 1]) + 1
            ms += cost.cycle_ms(depth, BLOCK_V, int(log.context_len[p]))
            tokens, p = tokens + gained, p + gained
            depths.append(depth)
    return {"tokens_per_s": 1000 * tokens / ms, "depth": float(np.mean(depths))}


def upfront_depth(log: ReplayLog, cost: CostModel, signals) -> dict:
    """Step 4 of the module docstring: rows of tokens/s ÷ the best static depth."""
    depths = range(1, UPFRONT_DEPTHS + 1)
    accepted = np.array([[log.accepted(p, d, BLOCK_V) for d in depths] for p in range(len(log))])
    cycle_ms = np.array(
        [[cost.cycle_ms(d, BLOCK_V, int(c)) for d in depths] for c in log.context_len]
    )
    static = {d: walk(log, cost, accepted, lambda p, d=d: d) for d in depths}
    best = max(static, key=lambda d: static[d]["tokens_per_s"])
    by_goodput = lambda gain: lambda p: int(np.argmax((1 + gain[p]) / cycle_ms[p])) + 1  # noqa: E731
    rows = {f"static depth {d}": row for d, row in static.items()}
    rows["hindsight depth"] = walk(log, cost, accepted, by_goodput(accepted))
    first_level = np.sort(log.scores[:, : log.shape.topk], axis=1)[:, ::-1]
    base = np.c_[first_level, log.context_len / 1000]
    mse = lambda out, y: ((out - y) ** 2).mean()  # noqa: E731
    for name, signal in signals:
        x = base if signal is None else np.c_[base, signal]
        predicted = np.zeros(accepted.shape, np.float32)
        for fold, held in folds(log):
            torch.manual_seed(fold)
            net = train(mlp(x.shape[1], UPFRONT_DEPTHS), x[~held], accepted[~held], mse,
                        epochs=60, batch_size=256)  # fmt: skip
            with torch.no_grad():
                predicted[held] = net(torch.tensor(x[held], dtype=torch.float32)).numpy()
        rows[f"regression, {name}"] = walk(log, cost, accepted, by_goodput(predicted))
        rows[f"regression, {name}"]["mse"] = float(((predicted - accepted) ** 2).mean())
    speed = static[best]["tokens_per_s"]
    for key, row in rows.items():
        row["vs_best_static"] = row["tokens_per_s"] / speed
        print(f"V {BLOCK_V}, {key:48} {row['tokens_per_s']:7.3f} tok/s "
              f"{row['vs_best_static']:6.3f}  depth {row['depth']:.2f}"
              + (f"  mse {row['mse']:.3f}" if "mse" in row else ""))  # fmt: skip
    return {"best_static_depth": best, **rows}


def correlations(log: ReplayLog, target: np.ndarray, best: dict) -> dict:
    """How the accepted length of the best static tree correlates with the draft's best
    first-level score and with the target's top-1 probability on x_t and x_{t+1}: across all
    positions, and within each quartile of that draft score (what the target adds)."""
    depth, size = best["depth"], best["size"]
    accepted = np.array([log.accepted(p, depth, size) for p in range(len(log))])
    draft = np.exp(log.scores[:, : log.shape.topk].max(axis=1))
    signals = {"target on x_t": target[:, HISTORY - 1, 0], "target on x_t+1": target[:, HISTORY, 0]}
    quartile = np.digitize(draft, np.quantile(draft, [0.25, 0.5, 0.75]))
    out = {"all": {"draft": float(np.corrcoef(draft, accepted)[0, 1])}}
    out["all"] |= {k: float(np.corrcoef(x, accepted)[0, 1]) for k, x in signals.items()}
    for q in range(4):
        keep = quartile == q
        out[f"draft quartile {q + 1}"] = {
            k: float(np.corrcoef(x[keep], accepted[keep])[0, 1]) for k, x in signals.items()
        }
    for key, row in out.items():
        print(f"correlation with accepted ({depth}, {size}), {key}: "
              + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--policies", default=None, help="LTD policies (default: RUN/policies)")
    args = parser.parse_args()
    config = json.loads((args.run / "train_config.json").read_text())
    policies = args.policies or (args.run / "policies")
    nets = LtdNets.load(resolve_policies(str(policies), config["target"]))
    log = ReplayLog.load(args.run / "replay", nets.shape)
    cost = CostModel.load(args.run / "cost.json")
    target = target_confidence(args.run, config["target"], log)
    trees = Trees(log)
    best = max(static_grid(log, cost), key=lambda row: row["tokens_per_s"])
    result: dict = {"cost_model": cost.source, "positions": len(log),
                    "best_static": [best["depth"], best["size"]]}  # fmt: skip
    result["correlations"] = correlations(log, target, best)
    forecasts = {}
    past = target[:, :HISTORY].reshape(len(log), -1)  # what a chooser at x_t can see
    future = target[:, HISTORY:].reshape(len(log), -1)  # the next HISTORY tokens' (hindsight)
    signals = (("draft", None), ("draft + target, past", past),
               ("draft + target, next tokens (not causal)", future))  # fmt: skip
    for name, signal in signals:
        forecasts[name], result[f"log_loss {name}"] = cross_fit(log, trees, signal)
        print(f"{name}: log loss {result[f'log_loss {name}']:.4f}", file=sys.stderr)
    sizes = range(1, 49)
    rules = {
        f"rule, {name}": decode(log, trees, cost, f.__getitem__, False, sizes, 1.0)
        for name, f in forecasts.items()
    }
    result["all"] = compare(log, cost, nets, best, sizes, rules)
    result["upfront_depth"] = upfront_depth(log, cost, signals)
    (args.run / "target_signal.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
