"""Command line: `specpilot COMMAND ...`, one module per command.

A command module has `register(commands)`, which adds its subparser (the arguments sit beside
the command they serve) with `run(args) -> exit status` as its handler; shared argument groups
and helpers are in `common`. Adding a command means adding its module and its name to COMMANDS.

Errors caused by input (SpecpilotError) print one clear line to stderr and exit with status 2;
results go to stdout, progress and summaries to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from specpilot.errors import SpecpilotError

COMMANDS = (
    "generate",
    "serve",
    "bench_serve",
    "train_dvi",
    "train_eagle",
    "export_head",
    "import_head",
    "train_ltd",
    "train_ppow",
    "plot_dvi",
    "bench",
    "profile",
    "profile_sv",
    "plot_batches",
    "models",
)
"""Command modules under specpilot.cli, in the order `specpilot --help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specpilot", description="Lossless, adaptive speculative decoding of LLMs."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except SpecpilotError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
