"""`specpilot plot-dvi`: acceptance against training step from train-dvi logs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specpilot.errors import ConfigError


def register(commands) -> None:
    parser = commands.add_parser("plot-dvi", help="acceptance vs step from train-dvi logs")
    parser.add_argument("logs", nargs="+", help="train_log.csv files")
    parser.add_argument("--label", action="append", help="one per log (default: folder name)")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specpilot.bench.plots import dvi_learning_curves

    labels = args.label or [Path(log).parent.name for log in args.logs]
    if len(labels) != len(args.logs):
        raise ConfigError(f"give one --label per log ({len(args.logs)}), got {len(labels)}")
    for log in args.logs:
        if not Path(log).is_file():
            raise ConfigError(f"train-dvi log not found: {log}")
    print(f"plot: {dvi_learning_curves(args.logs, labels, Path(args.out))}", file=sys.stderr)
    return 0
