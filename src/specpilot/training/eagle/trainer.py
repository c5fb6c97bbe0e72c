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
"""

from __future__ import annotations

import copy
import csv
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specpilot.config import require
from specpilot.drafting.eagle_head import EagleHead, EagleShape
from specpilot.errors import ConfigError
from specpilot.models.loading import cpu_autocast
from specpilot.training.eagle.data import Sample
from specpilot.training.eagle.feature_cache import FeatureCache
from specpilot.training.eagle.features import require_cpu_target, sequence_features
from specpilot.training.eagle.losses import chain_accepted_length, unrolled_losses

HEAD_DIR = "head"
CHECKPOINT_DIR = "checkpoint"
LOG_FILE = "train_log.csv"
CURVE_FILE = "learning_curve.png"
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
    max_seq_tokens: int = 1024
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
) -> EagleHead:
    """Train (or resume) a head for the loaded `target` (a LoadedModel on the lean decoder).
    `init`: continue training this head (continued distillation) instead of starting from the
    target's top layer; `feature_cache`: a folder that keeps the target's features of each
    sequence after its first prefill (feature_cache.py)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runner = target.runner
    require_cpu_target(runner)
    train, valid = split_samples(samples, config.valid_samples, config.max_seq_tokens)
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
    log = CsvLog(out / LOG_FILE, LOG_COLUMNS, state["update"])
    bar = tqdm(
        total=total_updates, initial=state["update"], disable=not progress, unit="update",
        desc="train-eagle",
    )  # fmt: skip
    started = time.perf_counter() - state.get("seconds", 0.0)
    update, epoch, index = state["update"], state["epoch"], state["index"]
    scored, sums = 0, _Sums(config.unroll)
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
                row |= evaluate(head, runner, valid, shape, config, target_rows, cache)
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
    final |= evaluate(head, runner, valid, shape, config, target_rows, cache) if valid else {}
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


def sequence_loss(head, runner, sample, shape, config, target_rows, cache=None, diagnostics=False):
    """The target's features for one sample (a prefill, or `cache`'s), then the head's unrolled
    loss on them (matrix products in bf16 autocast as `config.bf16` says); `diagnostics` as
    unrolled_losses'."""
    feats = sequence_features(runner, sample, shape.feature_layers, target_rows, cache=cache)
    with cpu_autocast(config.bf16):
        return unrolled_losses(
            head, feats.taps, feats.embeds, feats.target_logits, feats.loss_mask,
            feats.cos, feats.sin, config.unroll, config.step_decay, diagnostics,
        )  # fmt: skip


@torch.inference_mode()
def evaluate(head, runner, valid, shape, config, target_rows, cache=None) -> dict:
    """Held-out first-token agreement (step 1), teacher-forced chain accepted length, and at
    step 1 the head's entropy in nats and its overlap Σ min(p, q) with the target at T = 1 (RL
    fine-tuning may sharpen a head that sampled trees rely on, BENCHMARKS §12.2)."""
    head.eval()
    hits, count, entropy, overlap, taus = 0, 0, 0.0, 0.0, []
    for sample in valid:
        result = sequence_loss(
            head, runner, sample, shape, config, target_rows, cache, diagnostics=True
        )
        n = int(result.valid[0].sum())
        if n:
            hits += int(result.correct[0].sum())
            count += n
            entropy += result.entropy[0] * n
            overlap += result.overlap[0] * n
            taus.append((chain_accepted_length(result.correct, result.valid), n))
    total = sum(n for _, n in taus)
    return {
        "val_acc1": hits / max(count, 1),
        "val_tau": sum(t * n for t, n in taus) / max(total, 1),
        "val_entropy": entropy / max(count, 1),
        "val_overlap": overlap / max(count, 1),
    }


class _Sums:
    """Running means of the logged metrics over the positions since the last update."""

    def __init__(self, steps: int):
        self.steps = steps
        self.tokens_seen = 0
        self.reset_window()

    def reset_window(self) -> None:
        self.loss = 0.0
        self.count = 0
        self.hits = [0] * self.steps
        self.valid = [0] * self.steps

    def add(self, result, count: int) -> None:
        self.loss += float(result.loss.detach()) * count
        self.count += count
        self.tokens_seen += count
        for j in range(self.steps):
            self.hits[j] += int(result.correct[j].sum())
            self.valid[j] += int(result.valid[j].sum())

    def means(self) -> dict:
        row = {"loss": self.loss / max(self.count, 1)}
        for j in range(min(self.steps, 3)):
            row[f"acc{j + 1}"] = self.hits[j] / max(self.valid[j], 1)
        return row


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


def load_checkpoint(out: Path, shape: EagleShape, config: dict) -> tuple[EagleHead, dict] | None:
    """(head, state) of the run checkpointed in `out`, None if there is none; a checkpoint
    of another head shape or written with other settings (`config`, a dict) is refused rather
    than silently mixed (how often a run evaluates and saves may change)."""
    checkpoint = out / CHECKPOINT_DIR
    if not (checkpoint / "state.pt").is_file():
        return None
    head = EagleHead.load(checkpoint / HEAD_DIR, expected=shape)
    if head.shape != shape:  # the head's own choices: draft vocabulary, taps, MLP width
        raise ConfigError(
            f"{out} holds a head of another shape ({_diff(asdict(head.shape), asdict(shape))}); "
            "resume with the same options or use a new --out"
        )
    state = torch.load(checkpoint / "state.pt", weights_only=False)
    saved, current = _training_settings(state.get("config")), _training_settings(config)
    if saved is not None and saved != current:
        raise ConfigError(
            f"{out} holds a run with other settings ({_diff(saved, current)}); "
            "resume with the same options or use a new --out"
        )
    return head, state


def _training_settings(config: dict | None) -> dict | None:
    """The settings a resumed run must share: all but how often it evaluates and saves and
    whether it autocasts to bf16, which follows the machine it resumes on (an option added
    later with default None reads as unset in older runs)."""
    if config is None:
        return None
    skip = ("eval_every", "save_every", "bf16")
    return {k: v for k, v in config.items() if k not in skip and v is not None}


def _diff(saved: dict, current: dict) -> str:
    return ", ".join(
        f"{k}: {saved.get(k)!r} → {current.get(k)!r}"
        for k in sorted(set(saved) | set(current))
        if saved.get(k) != current.get(k)
    )


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


def save_checkpoint(out: Path, head: EagleHead, state: dict) -> None:
    """Head folder first, then state.pt by atomic rename: state.pt names a complete head."""
    checkpoint = out / CHECKPOINT_DIR
    head.save(checkpoint / HEAD_DIR, dtype=torch.float32)
    tmp = checkpoint / "state.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(checkpoint / "state.pt")


class CsvLog:
    """A training log (CSV), truncated to the resumed update so a restarted run appends
    cleanly."""

    def __init__(self, path: Path, columns: tuple[str, ...], update: int):
        self.path, self.columns = path, columns
        rows = []
        if path.is_file() and update > 0:
            with path.open() as f:
                rows = [r for r in csv.DictReader(f) if int(r["update"]) <= update]
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, columns)
            writer.writeheader()
            writer.writerows(rows)

    def write(self, row: dict) -> None:
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, self.columns, extrasaction="ignore").writerow(
                {k: (f"{v:.5g}" if isinstance(v, float) else v) for k, v in row.items()}
            )


def plot_learning_curve(log: Path, png: Path) -> None:
    """Training loss and held-out agreement / accepted length vs training tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with log.open() as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    tokens = [float(r["tokens"]) for r in rows if r["loss"]]
    left.plot(tokens, [float(r["loss"]) for r in rows if r["loss"]])
    left.set(xlabel="training positions", ylabel="soft cross-entropy", title="training loss")
    evals = [r for r in rows if r["val_acc1"]]
    if evals:
        x = [float(r["tokens"]) for r in evals]
        right.plot(
            x, [float(r["val_acc1"]) for r in evals], marker="o", label="first-token agreement"
        )
        twin = right.twinx()
        twin.plot(x, [float(r["val_tau"]) for r in evals], marker="s", color="C1", label="chain τ")
        twin.set_ylabel("accepted length τ (chain)")
        right.legend(loc="lower right")
    right.set(xlabel="training positions", ylabel="held-out agreement", title="validation")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def write_run_config(out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_config.json").write_text(json.dumps(meta, indent=1) + "\n")
