"""Command line: `specpilot COMMAND ...`, one module per command.

A command module has `register(commands)`, which adds its subparser (the arguments sit beside
the command they serve) with `run(args) -> exit status` as its handler; shared argument groups
and helpers are in `common`. Adding a command means adding its module and its name to COMMANDS.

Errors caused by input (SpecpilotError) print one clear line to stderr and exit with status 2,
with the flags that set the API arguments the error names appended (`error_flags`); results go to
stdout, progress and summaries to stderr.
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
    return _build()[0]


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `specpilot` parser and each command's own parser, by command name."""
    parser = argparse.ArgumentParser(
        prog="specpilot", description="Lossless, adaptive speculative decoding of LLMs."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(commands)
    return parser, commands.choices


def error_flags(error: SpecpilotError, command: argparse.ArgumentParser) -> list[str]:
    """The flags of `command` that set the API arguments `error` is about: argument `x_y` is
    set by `--x-y`; an argument the command has no flag for is left out."""
    flags = [f"--{option.replace('_', '-')}" for option in error.options]
    # argparse keeps its flag table private; it has had this name since Python 2.7.
    return [flag for flag in dict.fromkeys(flags) if flag in command._option_string_actions]


def main(argv: list[str] | None = None) -> int:
    parser, commands = _build()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except SpecpilotError as error:
        flags = error_flags(error, commands[args.command])
        hint = f" ({', '.join(flags)})" if flags else ""
        print(f"error: {error}{hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
