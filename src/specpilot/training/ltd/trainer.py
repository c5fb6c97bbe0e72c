"""PPO training of LTD's two policies on replay logs (stable-baselines3, the paper's settings).

Stages, as in the LTD paper: the size policy first with random depths, then the depth policy
with a fixed V, then co-adaptation (size with the depth policy frozen, depth with the size
policy frozen, ...). Every `eval_every` environment steps a stage checkpoints its PPO model,
scores its current actor on the validation prompts (replay tokens/s along their decoding
trajectories, deterministic decisions) and keeps the best actor: selection by validation, since
validation throughput peaks and then declines. A finished stage writes `done.json`; re-running
the same command skips finished stages and resumes an interrupted one from its checkpoint.
After each stage the best pair of policies so far is scored together, and the best pair is
exported to `policies/` (a folder `--policy ltd --ltd-policies` loads).
"""

from __future__ import annotations

import copy
import csv
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from tqdm import tqdm

from specpilot.config import require
from specpilot.policies.ltd import single_thread
from specpilot.policies.ltd_net import DEFAULT_HIDDEN, LtdNets, mlp
from specpilot.training.ltd.config import LtdTrainConfig
from specpilot.training.ltd.cost import CostModel
from specpilot.training.ltd.envs import (
    Chooser,
    DepthEnv,
    SizeEnv,
    hindsight_throughput,
    replay_throughput,
    static_grid,
)
from specpilot.training.ltd.replay import ReplayLog
from specpilot.tree import DEFAULT_DEPTH, DEFAULT_NODES

LOG_COLUMNS = [
    "stage", "policy", "steps", "train_reward", "train_depth", "train_size", "train_accepted",
    "valid_tokens_per_s", "valid_depth", "valid_size", "valid_accepted",
]  # fmt: skip


def learning_rate(config: LtdTrainConfig):
    """SB3 schedule (progress_remaining 1 → 0): linear warm-up, then linear decay to 0."""

    def schedule(remaining: float) -> float:
        done = 1.0 - remaining
        if done < config.warmup:
            return config.lr * max(done, 1e-6) / config.warmup
        return config.lr * remaining / (1.0 - config.warmup)

    return schedule


def actor(model) -> torch.nn.Sequential:
    """The SB3 policy's actor as a plain module: policy_net (Linear/ReLU) then action_net."""
    policy = model.policy
    layers = [*copy.deepcopy(policy.mlp_extractor.policy_net), copy.deepcopy(policy.action_net)]
    return torch.nn.Sequential(*layers).cpu().eval().requires_grad_(False)


def split(log: ReplayLog, fraction: float, seed: int) -> tuple[ReplayLog, ReplayLog]:
    """Train / validation positions, split by prompt (at least one prompt each)."""
    prompts = np.unique(log.prompt)
    require(len(prompts) >= 2, "LTD training needs replay logs of at least 2 prompts")
    order = np.random.default_rng(seed).permutation(prompts)
    n_valid = min(max(1, round(fraction * len(prompts))), len(prompts) - 1)
    return log.subset(np.sort(order[n_valid:])), log.subset(np.sort(order[:n_valid]))


class _Stage:
    """One stage's files: checkpoint.zip, best.safetensors (+ best.json), done.json."""

    def __init__(self, out: Path, name: str, policy: str, shape):
        self.folder = out / "stages" / name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.name, self.policy = name, policy
        features = shape.depth_features if policy == "depth" else shape.size_features
        actions = 2 if policy == "depth" else shape.size_actions
        self.shape_of_net = (features, DEFAULT_HIDDEN[policy], actions)

    @property
    def done(self) -> bool:
        return (self.folder / "done.json").is_file()

    def best_score(self) -> float:
        path = self.folder / "best.json"
        return json.loads(path.read_text())["tokens_per_s"] if path.is_file() else -np.inf

    def save_best(self, net: torch.nn.Module, score: dict) -> None:
        tmp = self.folder / "best.safetensors.tmp"
        save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp))
        tmp.replace(self.folder / "best.safetensors")
        (self.folder / "best.json").write_text(json.dumps(score) + "\n")

    def best(self) -> torch.nn.Sequential:
        net = mlp(*self.shape_of_net)
        net.load_state_dict(load_file(str(self.folder / "best.safetensors")))
        return net.eval().requires_grad_(False)


class _Log:
    def __init__(self, path: Path):
        self.path = path
        if not path.is_file():
            with path.open("w", newline="") as f:
                csv.DictWriter(f, LOG_COLUMNS).writeheader()

    def write(self, row: dict) -> None:
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, LOG_COLUMNS, extrasaction="ignore").writerow(
                {k: (f"{v:.5g}" if isinstance(v, float) else v) for k, v in row.items()}
            )


def train_ltd(
    log: ReplayLog,
    cost: CostModel,
    out: str | Path,
    config: LtdTrainConfig | None = None,
    target: str | None = None,
    progress: bool = True,
) -> dict:
    """Run (or resume) every stage; export the best pair to out/policies; return the summary."""
    with single_thread():
        return _train(log, cost, Path(out), config or LtdTrainConfig(), target, progress)


def _train(log, cost, out: Path, config: LtdTrainConfig, target, progress) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    train, valid = split(log, config.valid_fraction, config.seed)
    csv_log = _Log(out / "train_log.csv")
    nets: dict[str, torch.nn.Module | None] = {"depth": None, "size": None}
    best_pair, best_pair_score, stages = None, -np.inf, []
    for name, policy, steps in config.stages():
        stage = _Stage(out, name, policy, log.shape)
        if not stage.done:
            _run_stage(stage, steps, train, valid, cost, config, nets, csv_log, progress)
            (stage.folder / "done.json").write_text(json.dumps({"steps": steps}) + "\n")
        nets[policy] = stage.best()
        pair = Chooser(valid, nets["depth"], nets["size"], fixed_size=config.fixed_size,
                       check_every=config.check_every)  # fmt: skip
        score = replay_throughput(valid, cost, pair)
        stages.append({"stage": name, "policy": policy, "steps": steps, "valid": score})
        if score["tokens_per_s"] > best_pair_score:
            best_pair, best_pair_score = dict(nets), score["tokens_per_s"]
    require(best_pair is not None, "no training stage has any steps")
    LtdNets(log.shape, best_pair["depth"], best_pair["size"], target).save(out / "policies")
    summary = replay_summary(train, valid, cost, config, stages, best_pair)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot_curves(out / "train_log.csv", out / "curves.png")
    return summary


def replay_summary(train, valid, cost, config, stages, pair) -> dict:
    """Validation replay throughput of the chosen policies next to static trees: the best
    static (depth, V) on the training positions and the eagle drafter's default depth and node
    count (on the replay's width W, which may differ from the drafter's default top-k). The
    one-policy ablations fall back to those defaults, as `--policy ltd,use=...` does when
    decoding (the drafter's own depth or node count). `hindsight`: the ceiling of each use,
    the best a chooser with its choices could do knowing every outcome (hindsight_throughput)."""
    grid = static_grid(train, cost)
    best = max(grid, key=lambda row: row["tokens_per_s"])
    static = {}
    shapes = (("best_static", best["depth"], best["size"]),
              ("default", DEFAULT_DEPTH, DEFAULT_NODES))  # fmt: skip
    for label, depth, size in shapes:
        chooser = Chooser(valid, fixed_depth=depth, fixed_size=size)
        static[label] = {**replay_throughput(valid, cost, chooser), "depth": depth, "size": size}
    kinds = {"both": (pair["depth"], pair["size"]), "depth": (pair["depth"], None),
             "size": (None, pair["size"])}  # fmt: skip
    ltd = {}
    for use, (depth_net, size_net) in kinds.items():
        if (use != "size" and depth_net is None) or (use != "depth" and size_net is None):
            continue
        chooser = Chooser(valid, depth_net, size_net, fixed_depth=DEFAULT_DEPTH,
                          fixed_size=DEFAULT_NODES, check_every=config.check_every)  # fmt: skip
        ltd[use] = replay_throughput(valid, cost, chooser)
    depths = range(1, valid.shape.max_depth + 1)
    sizes = [valid.shape.size_of(action) for action in range(valid.shape.size_actions)]
    choices = {"both": (depths, sizes), "depth": (depths, [DEFAULT_NODES]),
               "size": ([DEFAULT_DEPTH], sizes)}  # fmt: skip
    hindsight = {use: hindsight_throughput(valid, cost, *pair) for use, pair in choices.items()}
    return {"config": asdict(config), "positions": {"train": len(train), "valid": len(valid)},
            "cost_model": cost.source, "stages": stages, "static": static, "ltd": ltd,
            "hindsight": hindsight}  # fmt: skip


def _run_stage(stage, steps, train, valid, cost, config, nets, csv_log, progress) -> None:
    shape = train.shape
    frozen = Chooser(train, nets["depth"], nets["size"], fixed_size=config.fixed_size,
                     check_every=config.check_every)  # fmt: skip
    seed = config.seed + int(stage.name.split("-")[0])
    if stage.policy == "size":
        env = SizeEnv(train, cost, frozen, config.reward, seed)
        gamma = config.gamma_size
    else:
        env = DepthEnv(train, cost, frozen, config.reward, seed)
        gamma = config.gamma_depth
    hidden = list(DEFAULT_HIDDEN[stage.policy])
    checkpoint = stage.folder / "checkpoint.zip"
    if checkpoint.is_file():
        model = PPO.load(checkpoint, env=env, device="cpu")
    else:
        model = PPO(
            "MlpPolicy",
            env,
            learning_rate=learning_rate(config),
            n_steps=config.n_steps,
            batch_size=config.batch_size,
            n_epochs=config.n_epochs,
            gamma=gamma,
            ent_coef=config.ent_coef,
            policy_kwargs={
                "net_arch": {"pi": hidden, "vf": list(DEFAULT_HIDDEN["size"])},
                "activation_fn": torch.nn.ReLU,
            },
            seed=seed,
            device="cpu",
            verbose=0,
        )
    remaining = steps - model.num_timesteps
    if remaining <= 0:
        return
    callback = _Evaluate(stage, valid, cost, config, nets, csv_log, shape, steps, progress)
    model.learn(remaining, callback=callback, reset_num_timesteps=False)
    if callback.last_eval != model.num_timesteps:
        callback.evaluate(model)
    model.save(checkpoint)


class _Evaluate(BaseCallback):
    """Progress bar, training statistics, periodic validation, checkpoints and the best actor."""

    def __init__(self, stage, valid, cost, config, nets, csv_log, shape, steps, progress):
        super().__init__()
        self.stage, self.valid, self.cost, self.config = stage, valid, cost, config
        self.nets, self.csv_log, self.shape, self.steps = nets, csv_log, shape, steps
        self.progress = progress
        self.cycles: list[dict] = []
        self.rewards: list[float] = []
        self.bar = None
        self.last_eval = 0

    def _on_training_start(self) -> None:
        self.last_eval = self.num_timesteps
        self.bar = tqdm(total=self.steps, initial=self.num_timesteps, unit="step",
                        desc=f"stage {self.stage.name}", disable=not self.progress)  # fmt: skip

    def _on_step(self) -> bool:
        for info, done, value in zip(
            self.locals["infos"], self.locals["dones"], self.locals["rewards"], strict=True
        ):
            if done and "cycle" in info:
                self.cycles.append(info["cycle"])
                self.rewards.append(float(value))
        self.bar.update(1)
        if self.num_timesteps - self.last_eval >= self.config.eval_every:
            self.evaluate(self.model)
            self.model.save(self.stage.folder / "checkpoint.zip")
        return True

    def _on_training_end(self) -> None:
        self.bar.close()

    def evaluate(self, model) -> None:
        self.last_eval = self.num_timesteps
        net = actor(model)
        nets = {**self.nets, self.stage.policy: net}
        chooser = Chooser(self.valid, nets["depth"], nets["size"],
                          fixed_depth=self.shape.max_depth, fixed_size=self.config.fixed_size,
                          check_every=self.config.check_every)  # fmt: skip
        if self.stage.policy == "size" and self.nets["depth"] is None:
            # Before any depth policy: score the size policy at every depth, as it trains.
            scores = [
                replay_throughput(
                    self.valid, self.cost, Chooser(self.valid, None, net, fixed_depth=d)
                )
                for d in range(1, self.shape.max_depth + 1)
            ]
            score = {key: float(np.mean([s[key] for s in scores])) for key in scores[0]}
        else:
            score = replay_throughput(self.valid, self.cost, chooser)
        if score["tokens_per_s"] > self.stage.best_score():
            self.stage.save_best(net, score)
        cycles = self.cycles or [{"depth": 0, "size": 0, "accepted": 0}]
        self.csv_log.write({
            "stage": self.stage.name, "policy": self.stage.policy, "steps": self.num_timesteps,
            "train_reward": float(np.mean(self.rewards)) if self.rewards else 0.0,
            "train_depth": float(np.mean([c["depth"] for c in cycles])),
            "train_size": float(np.mean([c["size"] for c in cycles])),
            "train_accepted": float(np.mean([c["accepted"] for c in cycles])),
            "valid_tokens_per_s": score["tokens_per_s"], "valid_depth": score["depth"],
            "valid_size": score["size"], "valid_accepted": score["accepted"],
        })  # fmt: skip
        self.cycles, self.rewards = [], []


def plot_curves(log: Path, png: Path) -> None:
    """Per stage: training reward and validation tokens/s, and the chosen depth and size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with log.open() as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    stages = list(dict.fromkeys(r["stage"] for r in rows))
    fig, axes = plt.subplots(2, len(stages), figsize=(4 * len(stages), 6), squeeze=False)
    for column, stage in enumerate(stages):
        part = [r for r in rows if r["stage"] == stage]
        x = [int(r["steps"]) for r in part]
        top, bottom = axes[0][column], axes[1][column]
        top.plot(x, [float(r["train_reward"]) for r in part], label="train reward")
        twin = top.twinx()
        twin.plot(x, [float(r["valid_tokens_per_s"]) for r in part], color="C1", marker="o",
                  label="valid tokens/s (replay)")  # fmt: skip
        top.set(title=f"stage {stage}", xlabel="steps", ylabel="train reward")
        twin.set_ylabel("validation tokens/s")
        bottom.plot(x, [float(r["valid_depth"]) for r in part], label="depth")
        bottom.set(xlabel="steps", ylabel="mean depth (validation)")
        twin = bottom.twinx()
        twin.plot(x, [float(r["valid_size"]) for r in part], color="C2", label="size V")
        twin.set_ylabel("mean V (validation)")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
