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
"""

from __future__ import annotations

import copy
import csv
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specpilot.drafting.eagle_head import EagleHead
from specpilot.errors import ConfigError
from specpilot.models.loading import cpu_autocast
from specpilot.training.eagle.data import Sample
from specpilot.training.eagle.feature_cache import FeatureCache
from specpilot.training.eagle.features import (
    SequenceFeatures,
    require_cpu_target,
    sequence_features,
)
from specpilot.training.eagle.trainer import (
    HEAD_DIR,
    LOG_FILE,
    CsvLog,
    EagleTrainConfig,
    evaluate,
    load_checkpoint,
    save_checkpoint,
    split_samples,
    train_eagle,
    warmup_cosine,
)
from specpilot.training.ppow import adaw
from specpilot.training.ppow.config import PpowConfig
from specpilot.training.ppow.loss import ppow_loss
from specpilot.training.ppow.rewards import (
    accepted_length,
    group_advantages,
    proximity_reward,
    speed_reward,
)
from specpilot.training.ppow.windows import (
    candidate_windows,
    head_prefix,
    judge_windows,
    unroll_windows,
)

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
            "(--gen-max-new-tokens) or a smaller --window"
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
        scores = evaluate(head, runner, valid, head.shape, EVAL, target_rows, cache)
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
            row |= evaluate(head, runner, valid, head.shape, EVAL, target_rows, cache)
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


def ppow_update(
    head, optimizer, train, candidates, chosen, features, runner, config, gamma, generator
) -> dict:
    """Rollouts, rewards and `ppo_epochs` gradient steps on the chosen windows; the logged
    means."""
    indices, lengths = candidates
    by_sample: dict[int, list[int]] = {}
    for c in chosen.tolist():
        by_sample.setdefault(int(indices[c]), []).append(int(lengths[c]))
    batches = [
        _rollout(head, train[i], prefix_lengths, features, runner, config, gamma, generator)
        for i, prefix_lengths in by_sample.items()
    ]
    windows = sum(b.tokens.shape[0] for b in batches)
    kls, clips, losses = [], [], []
    for _ in range(config.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        for batch in batches:
            with cpu_autocast(config.bf16):
                prefix = head_prefix(head, batch.feats)
                logp, _ = unroll_windows(
                    head, prefix, batch.feats, runner.embed, batch.lengths, config.group,
                    config.window, config.temperature, tokens=batch.tokens,
                )  # fmt: skip
            parts = ppow_loss(
                logp, batch.tokens, batch.old_logp, batch.advantages, batch.target_logp,
                config.clip_eps, config.kl_beta, config.kl_direction,
            )  # fmt: skip
            share = batch.tokens.shape[0] / windows
            (parts.loss * share).backward()
            kls.append(parts.kl * share)
            clips.append(parts.clip_fraction * share)
            losses.append(float(parts.loss.detach()) * share)
        torch.nn.utils.clip_grad_norm_(head.parameters(), config.clip_grad)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    epochs = config.ppo_epochs
    return {
        "reward": float(torch.cat([b.reward for b in batches]).mean()),
        "accepted": float(torch.cat([b.accepted for b in batches]).mean()),
        "prox_rate": float((torch.cat([b.prox for b in batches]) > 0).float().mean()),
        "kl": sum(kls) / epochs,
        "clip_frac": sum(clips) / epochs,
        "loss": sum(losses) / epochs,
    }


@dataclass
class Rollouts:
    """One sequence's groups: what the gradient steps re-score, and what the log reports.
    Window rows are window-major (row w·G + g)."""

    feats: SequenceFeatures
    lengths: list[int]
    tokens: torch.Tensor
    """[W·G, K] drafted draft-vocabulary ids."""
    old_logp: torch.Tensor
    """[W·G, K] their log-probability under the sampling policy."""
    advantages: torch.Tensor
    """[W·G]"""
    target_logp: torch.Tensor
    """[W·G, K, V] the target's log-distribution over the draft vocabulary."""
    reward: torch.Tensor
    accepted: torch.Tensor
    prox: torch.Tensor


def _rollout(head, sample, lengths, features, runner, config, gamma, generator) -> Rollouts:
    """G windows after each prefix length of one sample, with the target's verdict, rewards and
    advantages: everything the gradient steps need. The sample is cut after its last window
    (nothing later is seen by the head or the target), which halves the prefill on average."""
    end = max(lengths) + config.window
    feats = features(sample, keep_cache=True, length=end, with_logits=False)
    ids = sample.token_ids[:end]
    g, k = config.group, config.window
    with torch.no_grad(), cpu_autocast(config.bf16):
        prefix = head_prefix(head, feats)
        logp, tokens = unroll_windows(
            head, prefix, feats, runner.embed, lengths, g, k, config.temperature,
            generator=generator,
        )  # fmt: skip
    old_logp = logp.gather(-1, tokens[..., None]).squeeze(-1)
    full_ids = head.draft_ids[tokens]
    verdict = judge_windows(
        runner, ids, lengths, full_ids.view(len(lengths), g, k), head.draft_ids,
        config.temperature, config.prox_reference,
    )  # fmt: skip
    uniforms = torch.rand(verdict.logp.shape, generator=generator)
    draft_logp = old_logp.view(len(lengths), g, k)
    accepted = accepted_length(verdict.logp, draft_logp, config.acceptance, uniforms, verdict.best)
    reward = speed_reward(accepted, gamma)
    prox = torch.zeros_like(reward)
    if config.proximity:
        prox = proximity_reward(
            accepted, verdict.logp.sum(-1), verdict.reference_logp[:, None], config
        )
        reward = reward + prox
    advantages = group_advantages(reward, config.adv_eps)
    return Rollouts(
        feats,
        lengths,
        tokens,
        old_logp,
        advantages.reshape(-1),
        verdict.draft_logp.reshape(len(lengths) * g, k, -1),
        reward.reshape(-1),
        accepted.reshape(-1),
        prox.reshape(-1),
    )


@torch.inference_mode()
def measure_cost_ratio(runner, head: EagleHead, context: int = 128, repeats: int = 15) -> float:
    """γ: the time of one head draft step (block + draft LM head, in the target's dtype) over one
    target decode step, both one token after `context` cached positions (the fastest of
    `repeats` each: on a shared machine the minimum is the stable statistic)."""
    context = min(context, runner.max_length - 2)
    drafter = copy.deepcopy(head).to(dtype=runner.dtype)
    runner.reset()
    runner.run([i % runner.vocab_size for i in range(context)], logits="none")
    s = head.shape
    keys = torch.zeros(s.num_kv_heads, context, s.head_dim, dtype=runner.dtype)
    hidden = torch.zeros(1, s.hidden_size, dtype=runner.dtype)
    position = torch.tensor([context])

    def target_step():
        runner.run([1], logits="last")
        runner.rollback(context)

    def head_step():
        out, _, _ = drafter.block(
            hidden, hidden, runner.cos[position], runner.sin[position], keys, keys
        )
        drafter.logits(out)

    times = []
    for step in (target_step, head_step):
        for _ in range(3):  # warm-up: kernels are chosen on first use
            step()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            samples.append(time.perf_counter() - start)
        times.append(min(samples))
    runner.reset()
    return times[1] / times[0]


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


def continued_distillation(
    target,
    samples: list[Sample],
    out: str | Path,
    config: PpowConfig,
    init: EagleHead,
    batch_tokens: int,
    progress: bool = True,
    feature_cache: str | Path | None = None,
) -> EagleHead:
    """The baseline PPOW is compared with (its §5.4): the eagle trainer's objective, continued
    from the same head on the same samples for the same number of updates and learning rate."""
    kept = sum(len(s.response_ids) for s in split_samples(
        samples, config.valid_samples, config.max_seq_tokens
    )[0])  # fmt: skip
    per_epoch = max(1, kept // batch_tokens)
    eagle = EagleTrainConfig(
        epochs=-(-config.updates // per_epoch) + 1,
        lr=config.lr,
        warmup=max(1, config.warmup),
        batch_tokens=batch_tokens,
        max_seq_tokens=config.max_seq_tokens,
        valid_samples=config.valid_samples,
        eval_every=config.eval_every,
        save_every=config.save_every,
        seed=config.seed,
        max_updates=config.updates,
        bf16=config.bf16,
    )
    return train_eagle(
        target, samples, out, eagle, init.shape, progress, init=init, feature_cache=feature_cache
    )


def plot_curves(log: Path, png: Path, config: PpowConfig) -> None:
    """Reward, KL and accepted length per update (ADAW's start marked: the paper's signature is
    a dip in reward and a rise in KL there, then recovery)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with log.open() as f:
        logged = list(csv.DictReader(f))
    rows = [r for r in logged if r["reward"]]
    if not rows:
        return
    x = [int(r["update"]) for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = (("reward", "window reward"), ("kl", "KL per position"), ("accepted", "accepted k"))
    for ax, (column, label) in zip(axes, panels, strict=True):
        values = [float(r[column]) for r in rows]
        ax.plot(x, values, lw=0.6, alpha=0.4, label="rollouts")
        ax.plot(x, _running_mean(values, 25), lw=1.2, color="C0", label="mean of 25 updates")
        ax.set(xlabel="update", ylabel=label, title=label)
        if config.adaw:
            ax.axvline(config.adaw_start, color="grey", ls="--", lw=0.8, label="ADAW on")
    evals = [r for r in logged if r["val_tau"]]
    if evals:
        axes[2].plot(
            [int(r["update"]) for r in evals], [float(r["val_tau"]) - 1 for r in evals],
            marker="o", label="held-out chain τ − 1 (greedy, depth 3)",
        )  # fmt: skip
    for ax in axes:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _running_mean(values: list[float], span: int) -> list[float]:
    """Mean of each value and the up to `span` − 1 before it (rollout rewards are noisy)."""
    sums, out = [0.0], []
    for i, value in enumerate(values):
        sums.append(sums[-1] + value)
        start = max(0, i + 1 - span)
        out.append((sums[i + 1] - sums[start]) / (i + 1 - start))
    return out
