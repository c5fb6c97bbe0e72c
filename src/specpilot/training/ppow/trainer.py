"""`specpilot train-ppow`: window-level group-relative RL fine-tuning of a feature-drafter head
(PPOW), and its baseline, continued distillation from the same head.

Each update takes `windows_per_update` prefixes (ADAW's curriculum mix of hard and uniform
windows), grouped by training sequence so each sequence costs one teacher-forced target prefill:
1. rollouts: the head (θ_old) samples G windows of K tokens per prefix at temperature T, in its
   unrolled regime (`windows.unroll_windows`);
2. verdict: one target forward per sequence scores every window (`windows.judge_windows`);
   accepted length k by rejection sampling, reward k/(kγ+1) plus the proximity reward when
   k = 0, advantages normalised within each group;
3. `ppo_epochs` gradient steps on the clipped surrogate + β·KL(Q‖P), the head re-scoring the
   same tokens in the same regime.
Checkpoints (head, optimizer, ADAW pool, measured γ) are written atomically every `save_every`
updates; re-running the same command resumes. train_log.csv and ppow_curves.png (reward, KL,
accepted length) sit beside the final head in `out/head`.

The update lives in `update`, γ's measurement in `cost_ratio`, the plot in `curves` and the
continued-distillation baseline in `distillation`.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from specpilot.drafting.eagle_head import EagleHead
from specpilot.errors import ConfigError
from specpilot.training.eagle.checkpoints import HEAD_DIR, load_checkpoint, save_checkpoint
from specpilot.training.eagle.data import Sample
from specpilot.training.eagle.feature_cache import FeatureCache
from specpilot.training.eagle.features import require_cpu_target, sequence_features
from specpilot.training.eagle.run_log import LOG_FILE, CsvLog
from specpilot.training.eagle.scoring import evaluate
from specpilot.training.eagle.trainer import EagleTrainConfig, split_samples, warmup_cosine
from specpilot.training.ppow import adaw
from specpilot.training.ppow.config import PpowConfig
from specpilot.training.ppow.cost_ratio import measure_cost_ratio
from specpilot.training.ppow.curves import plot_curves
from specpilot.training.ppow.update import ppow_update
from specpilot.training.ppow.windows import candidate_windows

CURVES_FILE = "ppow_curves.png"
LOG_COLUMNS = (
    "update", "reward", "accepted", "prox_rate", "kl", "clip_frac", "loss", "hard_frac", "lr",
    "seconds", "val_acc1", "val_tau", "val_entropy", "val_overlap",
)  # fmt: skip
EVAL = EagleTrainConfig()
"""Held-out metrics as train-eagle logs them (first-token agreement, chain τ of depth 3), so
a PPOW run and its distillation baseline are measured alike."""


def train_ppow(
    target,
    samples: list[Sample],
    out: str | Path,
    config: PpowConfig,
    init: EagleHead,
    progress: bool = True,
    feature_cache: str | Path | None = None,
) -> EagleHead:
    """Fine-tune (or resume fine-tuning) `init` for the loaded `target` with PPOW
    (`feature_cache`: a folder that keeps the target's features of whole sequences for ADAW's
    scoring and the evaluations, and their KV caches, which rollouts cut at their prefixes)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runner = target.runner
    require_cpu_target(runner)
    train, valid = split_samples(samples, config.valid_samples, config.max_seq_tokens)
    candidates = candidate_windows(train, config.window)
    if candidates[0].numel() == 0:
        raise ConfigError(
            f"no training response has {config.window} tokens: use longer answers "
            "(gen_max_new_tokens) or a smaller window",
            options=("gen_max_new_tokens", "window"),
        )
    resumed = load_checkpoint(out, init.shape, asdict(config))
    if resumed is None:
        head = copy.deepcopy(init).float()
        gamma = config.gamma if config.gamma is not None else measure_cost_ratio(runner, head)
        state = {"update": 0, "seconds": 0.0, "gamma": gamma, "pool": None}
    else:
        head, state = resumed
    head.train()
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=0.0)
    if state.get("optimizer"):
        optimizer.load_state_dict(state["optimizer"])
    target_rows = runner.lm_head[head.draft_ids].contiguous()
    layers = head.shape.feature_layers
    cache = None if feature_cache is None else FeatureCache(feature_cache, runner, layers)
    held_out = FeatureCache.for_held_out(cache, runner, layers) if valid else None

    def features(sample: Sample, keep_cache=False, length=None, with_logits=True):
        return sequence_features(
            runner, sample, layers, target_rows, keep_cache, cache, length, with_logits
        )

    log = CsvLog(out / LOG_FILE, LOG_COLUMNS, state["update"])
    bar = tqdm(
        total=config.updates, initial=state["update"], disable=not progress, unit="update",
        desc="train-ppow",
    )  # fmt: skip
    started = time.perf_counter() - state["seconds"]
    pool = state["pool"]
    if state["update"] == 0 and valid:  # the initial head's held-out metrics, for comparison
        scores = evaluate(head, runner, valid, head.shape, EVAL, target_rows, held_out)
        log.write({"update": 0} | scores)
        head.train()
    for update in range(state["update"], config.updates):
        if adaw.refresh_due(update, config):
            scores = adaw.score_windows(
                head, train, candidates, features, config.window, config.bf16, progress,
                _scored_sequences(candidates[0], config, update),
            )  # fmt: skip
            pool = adaw.hard_pool(scores, config.adaw_pool)
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + update)
        fraction = adaw.hard_fraction(update, config)
        chosen = adaw.select_windows(
            config.windows_per_update, candidates[0].numel(), pool, fraction, generator
        )
        lr = warmup_cosine(update, config.lr, config.warmup, config.updates)
        for group in optimizer.param_groups:
            group["lr"] = lr
        row = ppow_update(
            head, optimizer, train, candidates, chosen, features, runner, config,
            state["gamma"], generator,
        )  # fmt: skip
        row |= {"update": update + 1, "hard_frac": fraction, "lr": lr}
        row["seconds"] = time.perf_counter() - started
        if (update + 1) % config.eval_every == 0 and valid:
            row |= evaluate(head, runner, valid, head.shape, EVAL, target_rows, held_out)
            head.train()
        log.write(row)
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward']:.3f}", k=f"{row['accepted']:.2f}")
        if (update + 1) % config.save_every == 0 or update + 1 == config.updates:
            _save(out, head, optimizer, config, update + 1, row["seconds"], state["gamma"], pool)
    bar.close()
    head.save(out / HEAD_DIR)
    plot_curves(out / LOG_FILE, out / CURVES_FILE, config)
    return head


def _scored_sequences(indices: torch.Tensor, config: PpowConfig, update: int) -> list[int] | None:
    """The sequences ADAW scores at this refresh: all, or a random `adaw_sequences` of them."""
    sequences = indices.unique()
    if config.adaw_sequences is None or config.adaw_sequences >= sequences.numel():
        return None
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + update + 500_000)
    order = torch.randperm(sequences.numel(), generator=generator)
    return sequences[order[: config.adaw_sequences]].tolist()


def _save(out, head, optimizer, config, update, seconds, gamma, pool) -> None:
    state = {
        "update": update,
        "seconds": seconds,
        "gamma": gamma,
        "pool": pool,
        "config": asdict(config),
        "optimizer": optimizer.state_dict(),
    }
    save_checkpoint(out, head, state)
