"""train-ppow's curves: reward, KL and accepted length per update, from its CSV log."""

from __future__ import annotations

import csv
from pathlib import Path

from specpilot.training.ppow.config import PpowConfig


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
