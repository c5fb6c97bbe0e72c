"""PPOW's settings: the paper's values where it gives them (Table A.3), the project's choices
(docs/methods.md §9) where it does not, and an option for each of those choices."""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.config import require

ACCEPTANCE = ("sampled", "expected", "greedy")
KL_DIRECTIONS = ("reverse", "forward")
PROX_FORMS = ("indicator", "soft")
PROX_REFERENCES = ("response", "greedy")


@dataclass(frozen=True)
class PpowConfig:
    updates: int = 600
    """Optimizer updates (the paper trains ~30k on H100s; this default is meant to fit SmolLM2 in
    a few CPU hours: set it from the seconds per update the progress bar shows)."""
    windows_per_update: int = 8
    """Prefixes (one rollout group each) per update."""
    window: int = 10
    """K: drafted tokens per window."""
    group: int = 8
    """G: windows sampled per prefix."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts and of the target distribution they are verified
    against."""
    gamma: float | None = 0.12
    """Relative drafter cost in the reward k/(kγ+1): the paper's 0.12 (Table A.3), or None:
    measured (a head step's time over a target step's) when the run starts, kept for resumes
    (noisy on a shared CPU, hence not the default)."""
    acceptance: str = "sampled"
    """Accepted length k: `sampled` (rejection sampling, the paper), `expected` (Σ_n Π a_j, lower
    variance) or `greedy` (longest prefix equal to the target's argmax)."""
    proximity: bool = True
    """Proximity reward for windows with k = 0 (off: the ablation without it)."""
    prox_alpha: float = 1.0
    prox_delta: float = 0.5
    prox_form: str = "indicator"
    """`indicator` α·1[Δ < δ] (the paper) or `soft` α·max(0, 1 − Δ/δ)."""
    prox_mean: bool = False
    """Δ per token (÷K) instead of the window's cumulative log-likelihood gap."""
    prox_absolute: bool = False
    """|L(ŷ) − L(y)| instead of the one-sided max(0, L(ŷ) − L(y))."""
    prox_reference: str = "response"
    """ŷ, the target-preferred window: the next K tokens of the training response (the
    target's own greedy answer: free) or `greedy` (K greedy target steps from the prefix)."""
    clip_eps: float = 0.2
    kl_beta: float = 0.03
    kl_direction: str = "reverse"
    """`reverse` KL(Q‖P) (the drafter anchored to the target) or `forward` KL(P‖Q)."""
    ppo_epochs: int = 1
    """Gradient steps on each batch of rollouts (θ_old is the policy that sampled them)."""
    adv_eps: float = 1e-6
    lr: float = 1e-5
    warmup_ratio: float = 0.05
    """Linear warm-up over this share of the updates, then cosine decay to 10 % (the schedule
    train-eagle uses, so the distillation baseline trains under the same one)."""
    clip_grad: float = 1.0
    adaw: bool = True
    """Adaptive divergence-aware windowing (off: uniform windows, the ablation without it)."""
    adaw_pool: float = 0.2
    """Fraction of candidate windows (highest criticality) in the hard pool."""
    adaw_curriculum: tuple[float, ...] = (0.2, 0.4, 0.6)
    """Hard-window fraction of each batch, one value per equal stage."""
    adaw_start: int = 0
    """Updates of uniform windows before ADAW starts (the stages split the rest)."""
    adaw_refresh: int = 200
    """Rescore the windows with the current head every this many updates."""
    adaw_sequences: int | None = None
    """Sequences scored per refresh (a fresh random subset each time; None: all). Scoring costs
    one target prefill per sequence: cap it on large targets."""
    valid_samples: int = 16
    max_seq_tokens: int = 1024
    eval_every: int = 25
    save_every: int = 25
    seed: int = 0
    bf16: bool | None = None
    """Head matrix products in bf16 autocast (as train-eagle); off: float32; None: where the
    CPU computes bf16 natively (models.loading.cpu_autocast)."""

    def __post_init__(self) -> None:
        require(self.updates >= 1, f"updates must be >= 1, got {self.updates}")
        require(self.windows_per_update >= 1, "windows_per_update must be >= 1")
        require(self.window >= 1, f"window must be >= 1, got {self.window}")
        require(
            self.group >= 2, f"group must be >= 2 (advantages are group-relative), got {self.group}"
        )
        require(self.temperature > 0, f"temperature must be > 0, got {self.temperature}")
        require(self.gamma is None or self.gamma >= 0, f"gamma must be >= 0, got {self.gamma}")
        for name, value, allowed in (
            ("acceptance", self.acceptance, ACCEPTANCE),
            ("prox_form", self.prox_form, PROX_FORMS),
            ("prox_reference", self.prox_reference, PROX_REFERENCES),
            ("kl_direction", self.kl_direction, KL_DIRECTIONS),
        ):
            require(value in allowed, f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        require(self.prox_alpha >= 0 and self.prox_delta > 0, "prox_alpha >= 0, prox_delta > 0")
        require(0 < self.clip_eps < 1, f"clip_eps must be in (0, 1), got {self.clip_eps}")
        require(self.kl_beta >= 0, f"kl_beta must be >= 0, got {self.kl_beta}")
        require(self.ppo_epochs >= 1, f"ppo_epochs must be >= 1, got {self.ppo_epochs}")
        require(self.adv_eps > 0, "adv_eps must be > 0")
        require(self.lr > 0, f"lr must be > 0, got {self.lr}")
        require(0 <= self.warmup_ratio < 1, "warmup_ratio must be in [0, 1)")
        require(0 < self.adaw_pool <= 1, f"adaw_pool must be in (0, 1], got {self.adaw_pool}")
        require(
            len(self.adaw_curriculum) >= 1 and all(0 <= f <= 1 for f in self.adaw_curriculum),
            f"adaw_curriculum needs fractions in [0, 1], got {self.adaw_curriculum}",
        )
        require(self.adaw_start >= 0, "adaw_start must be >= 0")
        require(self.adaw_refresh >= 1, "adaw_refresh must be >= 1")
        require(
            self.adaw_sequences is None or self.adaw_sequences >= 1,
            f"adaw_sequences must be >= 1, got {self.adaw_sequences}",
        )
        require(self.valid_samples >= 0, "valid_samples must be >= 0")
        require(self.max_seq_tokens >= self.window + 4, "max_seq_tokens must exceed the window")
        require(self.eval_every >= 1 and self.save_every >= 1, "eval/save intervals must be >= 1")

    @property
    def warmup(self) -> int:
        return round(self.warmup_ratio * self.updates)
