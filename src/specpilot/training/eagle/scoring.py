"""Scoring a feature-drafter head on sequences: the unrolled loss on one sequence's target
features, the held-out metrics every train-eagle evaluation logs (PPOW logs the same ones), and
the running means of the training metrics between updates."""

from __future__ import annotations

import torch

from specpilot.models.loading import cpu_autocast
from specpilot.training.eagle.features import sequence_features
from specpilot.training.eagle.losses import chain_accepted_length, unrolled_losses


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


class MetricSums:
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
