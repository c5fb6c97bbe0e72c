"""PNG plots of a bench report: speedup per category, accepted lengths, draft length over time."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

from specpilot.bench.methods import split_method  # noqa: E402


def method_label(method: str) -> str:
    """A method spec as a legend shows it: option values that are file paths by their file name
    (`sd:policy=sv,sv_profile=/work/runs/x/sv.json` → `sd:policy=sv,sv_profile=sv.json`)."""
    kind, options = split_method(method)
    if not options:
        return method
    shown = (
        f"{key}={Path(value).name if '/' in value else value}" for key, value in options.items()
    )
    return f"{kind}:{','.join(shown)}"


def _finish(fig, ax, path: Path) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "nothing to show", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _speedup_plot(rows: list[dict], path: Path) -> None:
    categories = sorted({r["category"] for r in rows if r["category"] != "all"}) + ["all"]
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != "ar"]
    lookup = {(r["method"], r["category"]): r["speedup"] or 0.0 for r in rows}
    width = 0.8 / max(1, len(methods))
    fig, ax = plt.subplots(figsize=(min(14, 3 + 0.3 * len(categories) * max(1, len(methods))), 4.5))
    for i, method in enumerate(methods):
        xs = [c + i * width for c in range(len(categories))]
        ax.bar(
            xs,
            [lookup.get((method, c), 0.0) for c in categories],
            width,
            label=method_label(method),
        )
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks([c + 0.4 - width / 2 for c in range(len(categories))], categories, rotation=30)
    ax.set_ylabel("speedup over plain decoding (ar)")
    _finish(fig, ax, path)


def _series_plot(rows: list[dict], path: Path, series, xlabel: str, ylabel: str, **style) -> None:
    """One line per method (overall rows) of the series `series(row)` returns (None = skip)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        values = series(row) if row["category"] == "all" else None
        if values:
            ax.plot(range(len(values)), values, label=method_label(row["method"]), **style)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _finish(fig, ax, path)


def _accepted_fractions(row: dict) -> list[float] | None:
    counts = row.get("accepted_histogram")
    return [c / sum(counts) for c in counts] if counts and row["method"] != "ar" else None


def _adaptive_draft_lengths(row: dict) -> list[int] | None:
    lengths = row.get("draft_lengths")  # constant policies draw flat lines: not informative
    return lengths if lengths and len(set(lengths)) > 1 else None


def _histogram_plot(rows: list[dict], path: Path) -> None:
    _series_plot(
        rows,
        path,
        _accepted_fractions,
        "accepted draft tokens per step",
        "fraction of steps",
        marker="o",
    )


def _draft_length_plot(rows: list[dict], path: Path) -> None:
    _series_plot(
        rows, path, _adaptive_draft_lengths, "verify step (first prompt)", "drafted tokens"
    )


def write_plots(rows: list[dict], prefix: Path) -> list[Path]:
    """Write the three plots as `<prefix>_speedup.png` etc.; return their paths."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, draw in (
        ("speedup", _speedup_plot),
        ("accepted", _histogram_plot),
        ("draft_length", _draft_length_plot),
    ):
        path = prefix.with_name(f"{prefix.name}_{name}.png")
        draw(rows, path)
        paths.append(path)
    return paths


def batch_goodput_plot(reports: list[dict], path: Path) -> Path:
    """Throughput over the batch (tokens/s, category "all") against batch size, one line per
    method, from bench reports that differ in --batch-size."""
    points: dict[str, list[tuple[int, float]]] = {}
    for report in reports:
        size = report["config"].get("batch_size", 1)
        for row in report["results"]:
            if row["category"] == "all":
                points.setdefault(row["method"], []).append((size, row["tokens_per_s"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, series in points.items():
        sizes, speeds = zip(*sorted(series), strict=True)
        ax.plot(sizes, speeds, marker="o", label=method_label(method))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("goodput (tokens/s over the batch)")
    _finish(fig, ax, path)
    return path


def dvi_learning_curves(logs: list[Path], labels: list[str], path: Path, window: int = 25) -> Path:
    """Batch acceptance rate against training step from `train-dvi` CSV logs (one line per log,
    a moving average over `window` steps; the raw per-step values faintly behind)."""
    import csv

    fig, ax = plt.subplots(figsize=(7, 4))
    for log, label in zip(logs, labels, strict=True):
        with open(log, newline="") as source:
            rows = list(csv.DictReader(source))
        steps = [int(r["step"]) for r in rows]
        rates = [float(r["acceptance"]) for r in rows]
        smooth = [
            sum(rates[max(0, i - window + 1) : i + 1]) / len(rates[max(0, i - window + 1) : i + 1])
            for i in range(len(rates))
        ]
        (line,) = ax.plot(steps, smooth, label=label)
        ax.plot(steps, rates, color=line.get_color(), alpha=0.15, linewidth=0.8)
    ax.set_xlabel("training step (8 verified blocks each)")
    ax.set_ylabel(f"batch acceptance rate ({window}-step mean)")
    _finish(fig, ax, path)
    return path


def serve_load_plot(report: dict, path: Path) -> Path:
    """bench-serve: throughput, time to first token and time per output token against
    concurrency."""
    levels = report["levels"]
    x = [level["concurrency"] for level in levels]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    axes[0].plot(x, [level["tokens_per_s"] for level in levels], marker="o", label="tokens/s")
    axes[0].set_ylabel("output tokens/s (all requests)")
    for ax, metric, label in (
        (axes[1], "ttft", "time to first token (ms)"),
        (axes[2], "tpot", "time per output token (ms)"),
    ):
        for p in (50, 90, 99):
            ax.plot(x, [level[f"{metric}_p{p}_ms"] for level in levels], marker="o", label=f"p{p}")
        ax.set_ylabel(label)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(c) for c in x])
        ax.minorticks_off()
        ax.set_xlabel("concurrent requests")
        ax.legend(fontsize=7)
    fig.suptitle(f"{report['model']} at {report['config']['url']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
