"""PPOW's baseline: continued distillation of the same head with train-eagle's objective."""

from __future__ import annotations

from pathlib import Path

from specpilot.drafting.eagle_head import EagleHead
from specpilot.training.eagle.data import Sample
from specpilot.training.eagle.trainer import EagleTrainConfig, split_samples, train_eagle
from specpilot.training.ppow.config import PpowConfig


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
