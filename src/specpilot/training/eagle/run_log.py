"""A training run's files beside its head: the CSV log (resumable), the learning-curve plot and
the run's settings as JSON."""

from __future__ import annotations

import csv
import json
from pathlib import Path

LOG_FILE = "train_log.csv"
CURVE_FILE = "learning_curve.png"


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
