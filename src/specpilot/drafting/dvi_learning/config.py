"""DVI training hyperparameters and the ablation objectives (docs/methods.md §3.3-3.5).

The defaults are the DVI paper's and its authors' code's values, except two that this project's
runs measured to learn faster (BENCHMARKS.md §6.1, §6.8): `lr` 2e-3 (the code's: 5e-4) and
`updates_per_step` 8 (the paper's: 1). Pass those values to train as the paper does.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from specpilot.config import require
from specpilot.errors import ConfigError

CONFIG_FILE = "train_config.json"
"""In a `train-dvi` output folder: the DviTrainConfig of the run, so that learning on live
traffic (`--learn`) can go on with the settings the head was trained with."""

OBJECTIVES = ("full", "kl", "pg", "ce")
"""full: the KL→RL schedule; kl: distillation only; pg: on-policy REINFORCE only; ce: the
reward-masked cross-entropy (L_pg) only (the DVI paper's ablations, §4.3)."""


@dataclass(frozen=True)
class DviTrainConfig:
    objective: str = "full"
    batch_size: int = 64
    """Minibatch drawn from the replay buffer per update."""
    rollout_blocks: int = 8
    """Verified blocks per training step."""
    updates_per_step: int = 8
    """Optimizer updates per training step, each on its own minibatch (the replay ratio). The
    paper takes 1; generation costs far more than an update of the head (~1.5 s for 8 blocks on
    SmolLM2-135M against ~10 ms per update), so 8 updates learn about 1.5× faster from the same
    decoded tokens. The schedule counts training steps that updated, so it does not run faster
    with more updates."""
    buffer_capacity: int = 4096
    warmup_steps: int = 40
    """T_warmup: steps (that updated) with the KL term only."""
    ramp_steps: int = 80
    """T_ramp: steps over which λ_pg rises to pg_max and λ_kl falls to kl_min."""
    kl_start: float = 1.0
    kl_min: float = 0.05
    pg_max: float = 1.0
    ce_weight: float = 0.1
    entropy_weight: float = 0.0
    kl_temperature: float = 1.0
    kl_direction: str = "forward"
    """forward = KL(p_target^τ ‖ p_draft) (the authors' code); reverse = KL(p_draft ‖ p_target^τ)
    (the paper's text)."""
    ce_target: str = "verifier_argmax"
    """What L_CE fits: the verifier's argmax (always a correct label) or the drafted token."""
    rl_weight: float = 1.0
    baseline_decay: float = 0.9
    anchor_start: float = 0.5
    anchor_min: float = 0.05
    anchor_steps: int = 2000
    """β(t), the policy step's KL anchor, decays linearly from anchor_start to anchor_min."""
    lr: float = 2e-3
    """AdamW learning rate of the LoRA factors (the authors' code: 5e-4, for 2,000 steps). Adam
    moves each weight by about lr per update, and runs here last a few hundred steps."""
    scale_lr: float = 1e-2
    """Learning rate of the head's log logit scale (0 keeps the scale at 1). Adam moves each
    parameter by about lr per update, so at the LoRA's rate the scale would need thousands of
    updates to reach the 1/4 an early exit wants."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        require(
            self.objective in OBJECTIVES,
            f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}",
        )
        require(
            self.kl_direction in ("forward", "reverse"),
            f"kl_direction must be forward or reverse, got {self.kl_direction!r}",
        )
        require(
            self.ce_target in ("verifier_argmax", "draft_action"),
            f"ce_target must be verifier_argmax or draft_action, got {self.ce_target!r}",
        )
        for name in (
            "batch_size",
            "rollout_blocks",
            "updates_per_step",
            "buffer_capacity",
            "anchor_steps",
        ):
            require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        require(self.buffer_capacity >= self.batch_size, "buffer_capacity must be >= batch_size")
        for name in ("warmup_steps", "ramp_steps"):
            require(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("kl_start", "kl_min", "pg_max", "ce_weight", "entropy_weight", "rl_weight"):
            require(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        require(self.kl_temperature > 0, f"kl_temperature must be > 0, got {self.kl_temperature}")
        require(0 <= self.baseline_decay < 1, "baseline_decay must be in [0, 1)")
        require(self.lr > 0, f"lr must be > 0, got {self.lr}")
        require(self.scale_lr >= 0, f"scale_lr must be >= 0, got {self.scale_lr}")
        require(self.grad_clip > 0, f"grad_clip must be > 0, got {self.grad_clip}")

    def save(self, folder: str | Path) -> None:
        """Write CONFIG_FILE into `folder` atomically."""
        tmp = Path(folder) / (CONFIG_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, Path(folder) / CONFIG_FILE)

    @classmethod
    def of_run(cls, folder: str | Path | None) -> DviTrainConfig | None:
        """The config a `train-dvi` output folder was trained with; None for anything else (an
        adapter folder, no folder)."""
        path = None if folder is None else Path(folder).expanduser() / CONFIG_FILE
        if path is None or not path.is_file():
            return None
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as error:
            raise ConfigError(f"{str(path)!r} is corrupt: {error}") from None
