"""`specpilot train-eagle`: distil the target into a feature-drafter head.

Stages, each resumable by re-running the same command on the same --out:
1. data: the target's greedy answers to training prompts (`data.generate_responses`, appended
   batch by batch) plus, optionally, the training sets' reference answers;
2. training: per sequence one teacher-forced target prefill (taps + soft labels) and the head's
   unrolled loss (`losses.unrolled_losses`), gradients accumulated to `batch_tokens` scored
   positions per AdamW update; a held-out slice of the data is scored every `eval_every` updates
   (first-token agreement, chain accepted length). Checkpoints (head + optimizer + position) are
   written atomically every `save_every` updates and at the end, with the final head in
   `out/head` and train_log.csv + learning_curve.png beside it.

Scoring lives in `scoring`, checkpoints in `checkpoints`, the log and plot in `run_log`.
"""

from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specpilot.config import require
from specpilot.drafting.eagle_head import EagleHead, EagleShape
from specpilot.training.eagle.checkpoints import HEAD_DIR, load_checkpoint, save_checkpoint
from specpilot.training.eagle.data import Sample
from specpilot.training.eagle.feature_cache import FeatureCache
from specpilot.training.eagle.features import require_cpu_target
from specpilot.training.eagle.run_log import (
    CURVE_FILE,
    LOG_FILE,
    CsvLog,
    plot_learning_curve,
    write_run_config,
)
from specpilot.training.eagle.scoring import MetricSums, evaluate, sequence_loss

__all__ = [
    "LOG_FILE",
    "EagleTrainConfig",
    "count_updates",
    "draft_vocabulary_ids",
    "evaluate",
    "split_samples",
    "train_eagle",
    "warmup_cosine",
    "write_run_config",
]
LOG_COLUMNS = (
    "update", "epoch", "tokens", "loss", "acc1", "acc2", "acc3", "lr", "seconds",
    "val_acc1", "val_tau", "val_entropy", "val_overlap",
)  # fmt: skip


@dataclass(frozen=True)
class EagleTrainConfig:
    """Optimisation settings (EAGLE-3's objective; values measured on this project's CPUs)."""

    epochs: int = 2
    lr: float = 3e-4
    """AdamW peak learning rate (linear warm-up, cosine decay to 10 %)."""
    warmup: int = 20
    """Updates of linear warm-up."""
    weight_decay: float = 0.0
    batch_tokens: int = 2048
    """Scored positions per update (whole sequences are accumulated until this is reached)."""
    unroll: int = 3
    """Training-time-test steps (EAGLE-3 trains >= 3 draft steps)."""
    step_decay: float = 0.8
    """Loss weight of step j: decay^(j − 1)."""
    max_seq_tokens: int = 2048
    """Sequences are cut to this and longer prompts dropped: room for the longest prompt the
    target answers (`DataOptions.max_prompt_tokens`, 1536) and an answer of 384 tokens."""
    valid_samples: int = 32
    """Held-out samples (the last ones of the data) scored for validation."""
    eval_every: int = 25
    save_every: int = 50
    clip: float = 1.0
    seed: int = 0
    max_updates: int | None = None
    """Stop after this many updates (None: after `epochs`); PPOW's continued-distillation
    baseline trains exactly as many updates as the PPOW run it is compared with."""
    bf16: bool | None = None
    """Head matrix products in bf16 autocast; off: float32; None: where the CPU computes bf16
    natively (models.loading.cpu_autocast). A resumed run may differ: it follows the machine."""

    def __post_init__(self) -> None:
        require(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        require(
            self.max_updates is None or self.max_updates >= 1,
            f"max_updates must be >= 1, got {self.max_updates}",
        )
        require(self.lr > 0, f"lr must be > 0, got {self.lr}")
        require(self.batch_tokens >= 1, f"batch_tokens must be >= 1, got {self.batch_tokens}")
        require(1 <= self.unroll <= 8, f"unroll must be in 1..8, got {self.unroll}")
        require(0 < self.step_decay <= 1, f"step_decay must be in (0, 1], got {self.step_decay}")
        require(self.max_seq_tokens >= 8, "max_seq_tokens must be >= 8")
        require(self.valid_samples >= 0, "valid_samples must be >= 0")
        require(self.eval_every >= 1 and self.save_every >= 1, "eval/save intervals must be >= 1")


def warmup_cosine(update: int, lr: float, warmup: int, total: int) -> float:
    """Learning rate of (0-based) `update`: linear warm-up over `warmup` updates, then cosine
    decay to 10 % at `total`."""
    if update < warmup:
        return lr * (update + 1) / warmup
    progress = min(1.0, (update - warmup) / max(1, total - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def draft_vocabulary_ids(samples: list[Sample], vocab_size: int, size: int, special: list[int]):
    """The `size` target ids most frequent in the training responses (ties: lower id), plus the
    special tokens (they end turns), sorted."""
    if size >= vocab_size:
        return torch.arange(vocab_size)
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for sample in samples:
        ids = torch.tensor(sample.response_ids, dtype=torch.long)
        counts += torch.bincount(ids[ids < vocab_size], minlength=vocab_size)
    specials = [i for i in special if i < vocab_size]
    counts[specials] = counts.max() + 1
    order = torch.sort(-counts, stable=True).indices[:size]
    return torch.sort(order).values


def split_samples(
    samples: list[Sample], valid_samples: int, max_seq_tokens: int
) -> tuple[list[Sample], list[Sample]]:
    """(train, held-out): the last `valid_samples` usable samples are held out; training
    samples are cut to `max_seq_tokens` (prompts longer than that are dropped)."""
    samples = [s for s in samples if len(s.response_ids) >= 2]
    require(
        len(samples) > valid_samples,
        f"{len(samples)} usable samples; need more than valid_samples={valid_samples}",
    )
    valid = samples[len(samples) - valid_samples :]
    train = [
        Sample(s.id, s.prompt_ids, s.response_ids[: max_seq_tokens - len(s.prompt_ids)])
        for s in samples[: len(samples) - valid_samples]
        if len(s.prompt_ids) + 2 <= max_seq_tokens
    ]
    return train, valid


def train_eagle(
    target,
    samples: list[Sample],
    out: str | Path,
    config: EagleTrainConfig,
    shape: EagleShape,
    progress: bool = True,
    init: EagleHead | None = None,
    feature_cache: str | Path | None = None,
    valid: list[Sample] | None = None,
) -> EagleHead:
    """Train (or resume) a head for the loaded `target` (a LoadedModel on the lean decoder).
    `init`: continue training this head (continued distillation) instead of starting from the
    target's top layer; `feature_cache`: a folder that keeps the target's features of each
    sequence after its first prefill (feature_cache.py); `valid`: held-out samples that score
    the head, every sample then training (default: the last `config.valid_samples` of
    `samples`; a fixed set lets heads trained on more data be compared)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runner = target.runner
    require_cpu_target(runner)
    if valid is None:
        train, valid = split_samples(samples, config.valid_samples, config.max_seq_tokens)
    else:
        train, _ = split_samples(samples, 0, config.max_seq_tokens)
    special = [*target.tokenizer.all_special_ids, *target.tokenizer.added_tokens_decoder]
    head, state = _start_or_resume(out, runner, train, shape, config, special, init)
    optimizer = torch.optim.AdamW(
        [p for p in head.parameters()], lr=config.lr, weight_decay=config.weight_decay
    )
    if state.get("optimizer"):
        optimizer.load_state_dict(state["optimizer"])
    total_updates = count_updates(train, config)
    if config.max_updates is not None:
        total_updates = min(total_updates, config.max_updates)
    target_rows = runner.lm_head[head.draft_ids].contiguous()
    cache = (
        None if feature_cache is None else FeatureCache(feature_cache, runner, shape.feature_layers)
    )
    held_out = FeatureCache.for_held_out(cache, runner, shape.feature_layers) if valid else None
    log = CsvLog(out / LOG_FILE, LOG_COLUMNS, state["update"])
    bar = tqdm(
        total=total_updates, initial=state["update"], disable=not progress, unit="update",
        desc="train-eagle",
    )  # fmt: skip
    started = time.perf_counter() - state.get("seconds", 0.0)
    update, epoch, index = state["update"], state["epoch"], state["index"]
    scored, sums = 0, MetricSums(config.unroll)
    sums.tokens_seen = state["tokens"]
    head.train()
    while epoch < config.epochs and update < total_updates:
        order = list(range(len(train)))
        random.Random(config.seed + epoch).shuffle(order)
        while index < len(order) and update < total_updates:
            sample = train[order[index]]
            index += 1
            result = sequence_loss(head, runner, sample, shape, config, target_rows, cache)
            count = int(result.valid[0].sum())
            if count == 0:
                continue
            (result.loss * count / config.batch_tokens).backward()
            scored += count
            sums.add(result, count)
            if scored < config.batch_tokens:
                continue
            lr = warmup_cosine(update, config.lr, config.warmup, total_updates)
            for group in optimizer.param_groups:
                group["lr"] = lr
            torch.nn.utils.clip_grad_norm_(head.parameters(), config.clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            update += 1
            row = {"update": update, "epoch": epoch, "tokens": sums.tokens_seen, "lr": lr}
            row |= sums.means()
            row["seconds"] = time.perf_counter() - started
            if update % config.eval_every == 0 and valid:
                row |= evaluate(head, runner, valid, shape, config, target_rows, held_out)
                head.train()
            log.write(row)
            bar.update(1)
            bar.set_postfix(loss=f"{row['loss']:.3f}", acc1=f"{row['acc1']:.3f}")
            scored = 0
            sums.reset_window()
            if update % config.save_every == 0:
                _save(out, head, optimizer, config, update, epoch, index, row["seconds"], sums)
        if index >= len(order):
            epoch, index = epoch + 1, 0
    bar.close()
    seconds = time.perf_counter() - started
    _save(out, head, optimizer, config, update, epoch, index, seconds, sums)
    final = {"update": update, "epoch": epoch, "tokens": sums.tokens_seen, "seconds": seconds}
    final |= evaluate(head, runner, valid, shape, config, target_rows, held_out) if valid else {}
    log.write(final)
    head.save(out / HEAD_DIR)
    plot_learning_curve(out / LOG_FILE, out / CURVE_FILE)
    return head


def count_updates(train: list[Sample], config: EagleTrainConfig) -> int:
    """Updates the run will take: whole sequences are accumulated until `batch_tokens` scored
    positions (one per response token), in each epoch's shuffled order, so the learning-rate
    schedule ends where training does."""
    updates = 0
    for epoch in range(config.epochs):
        order = list(range(len(train)))
        random.Random(config.seed + epoch).shuffle(order)
        scored = 0
        for i in order:
            scored += len(train[i].response_ids)
            if scored >= config.batch_tokens:
                updates, scored = updates + 1, 0
    return updates


def _start_or_resume(
    out: Path, runner, train, shape: EagleShape, config, special: list[int], init
) -> tuple[EagleHead, dict]:
    resumed = load_checkpoint(out, shape, asdict(config))
    if resumed is not None:
        return resumed
    if init is not None:
        return copy.deepcopy(init).float(), {"update": 0, "epoch": 0, "index": 0, "tokens": 0}
    ids = draft_vocabulary_ids(train, shape.vocab_size, shape.draft_vocab_size, special)
    head = EagleHead(shape, ids)
    head.init_from_target(runner)
    return head, {"update": 0, "epoch": 0, "index": 0, "tokens": 0}


def _save(out, head, optimizer, config, update, epoch, index, seconds, sums) -> None:
    state = {
        "update": update,
        "epoch": epoch,
        "index": index,
        "seconds": seconds,
        "tokens": sums.tokens_seen,
        "config": asdict(config),
        "optimizer": optimizer.state_dict(),
    }
    save_checkpoint(out, head, state)
