"""LTD training settings (kept apart from the trainer so the CLI reads them without importing
stable-baselines3)."""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.config import require

REWARDS = ("throughput", "accepted", "time")
"""Cycle rewards: the paper's throughput and its Table 2 ablation alternatives."""


@dataclass(frozen=True)
class LtdTrainConfig:
    size_steps: int = 100_000
    depth_steps: int = 1_000_000
    co_steps: int = 100_000
    """Steps of each co-adaptation stage."""
    co_iterations: int = 2
    """Co-adaptation stages after the two initial ones: size, depth, size, ..."""
    n_steps: int = 2048
    batch_size: int = 256
    n_epochs: int = 20
    ent_coef: float = 0.01
    lr: float = 1e-3
    warmup: float = 0.01
    """Fraction of a stage's steps with a linear learning-rate warm-up (then linear decay to 0)."""
    gamma_size: float = 0.9
    gamma_depth: float = 0.999
    reward: str = "throughput"
    fixed_size: int = 60
    """V while the depth policy trains before any size policy exists (the paper's 60)."""
    check_every: int = 1
    eval_every: int = 10_000
    valid_fraction: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("size_steps", "depth_steps", "co_steps", "co_iterations"):
            require(getattr(self, name) >= 0, f"{name} must be >= 0")
        for name in ("n_steps", "batch_size", "n_epochs", "eval_every", "fixed_size"):
            require(getattr(self, name) >= 1, f"{name} must be >= 1")
        require(self.reward in REWARDS, f"reward must be one of {', '.join(REWARDS)}")
        require(0 < self.valid_fraction < 1, "valid_fraction must be in (0, 1)")
        require(0 <= self.warmup < 1, "warmup must be in [0, 1)")
        require(self.lr > 0, "lr must be > 0")

    def stages(self) -> list[tuple[str, str, int]]:
        """(name, policy, steps) in order; stages of 0 steps are left out."""
        stages = [("1-size", "size", self.size_steps), ("2-depth", "depth", self.depth_steps)]
        for i in range(self.co_iterations):
            policy = "size" if i % 2 == 0 else "depth"
            stages.append((f"{i + 3}-{policy}", policy, self.co_steps))
        return [stage for stage in stages if stage[2] > 0]
