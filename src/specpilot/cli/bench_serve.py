"""`specpilot bench-serve`: load a running `specpilot serve` (or any OpenAI-compatible server on
this machine) at several concurrency levels: throughput, TTFT and TPOT percentiles,
acceptance; a table, and optionally JSON and a PNG."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from specpilot.cli.common import int_list
from specpilot.errors import ConfigError

DEFAULT_URL = "http://127.0.0.1:8000"


def register(commands) -> None:
    parser = commands.add_parser(
        "bench-serve", help="load-test a local OpenAI-compatible server at several concurrencies"
    )
    parser.add_argument("--url", default=DEFAULT_URL, help="server base URL (loopback only)")
    parser.add_argument(
        "--concurrency", default="1,4,16,64", help="comma-separated levels (default %(default)s)"
    )
    parser.add_argument("--requests", type=int, default=64, help="requests per level")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--model", help="model to ask for (default: the first /v1/models lists)")
    parser.add_argument(
        "--prompts-file", help="JSONL prompts (first turn of each; default: a built-in set)"
    )
    parser.add_argument("--timeout-s", type=float, default=600.0, help="time limit per level")
    parser.add_argument("--json-out", help="write the report here")
    parser.add_argument("--plot", help="write a PNG here")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import httpx

    from specpilot.bench.run import write_json
    from specpilot.bench.serve_load import LoadSettings, load_table, run_load
    from specpilot.prompts import read_prompts_file

    settings = LoadSettings(
        args.url,
        int_list(args.concurrency),
        args.requests,
        args.max_tokens,
        args.temperature,
        args.timeout_s,
        args.model,
    )
    prompts = None
    if args.prompts_file:
        prompts = [record.turns[0] for record in read_prompts_file(args.prompts_file)]

    def progress(level: dict) -> None:
        print(
            f"concurrency {level['concurrency']}: {level['requests']} ok, "
            f"{level['errors']} errors, {level['tokens_per_s']:.1f} tok/s",
            file=sys.stderr,
        )

    try:
        report = asyncio.run(run_load(settings, prompts, progress))
    except httpx.HTTPError as error:
        raise ConfigError(f"cannot reach a server at {args.url}: {error}") from None
    print(load_table(report["levels"]))
    if args.json_out:
        write_json(args.json_out, report)
        print(f"report: {args.json_out}", file=sys.stderr)
    if args.plot:
        from specpilot.bench.plots import serve_load_plot

        print(f"plot: {serve_load_plot(report, Path(args.plot))}", file=sys.stderr)
    return 0
