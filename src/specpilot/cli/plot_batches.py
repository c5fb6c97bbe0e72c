"""`specpilot plot-batches`: goodput against batch size from bench reports."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specpilot.errors import ConfigError


def register(commands) -> None:
    parser = commands.add_parser(
        "plot-batches", help="goodput vs batch size from bench reports run at several sizes"
    )
    parser.add_argument("reports", nargs="+", help="bench JSON reports (--json-out)")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specpilot.bench.plots import batch_goodput_plot

    reports = []
    for path in args.reports:
        try:
            with open(path) as source:
                reports.append(json.load(source))
        except (OSError, ValueError) as error:
            raise ConfigError(f"cannot read bench report {path!r}: {error}") from None
    print(f"plot: {batch_goodput_plot(reports, Path(args.out))}", file=sys.stderr)
    return 0
