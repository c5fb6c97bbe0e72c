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
    parser.add_argument(
        "--url",
        action="append",
        help=f"server base URL, loopback only (default {DEFAULT_URL}); repeat it to compare "
        "servers in turns: each round sends the same requests to one server after another, so "
        "a drifting host slows all alike, and each server after the first is reported as the "
        "median of its per-round speed ratios to the first",
    )
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
    from specpilot.bench.serve_load import LoadSettings, load_table, run_load, run_load_in_turns
    from specpilot.prompts import read_prompts_file

    urls = args.url or [DEFAULT_URL]
    settings = LoadSettings(
        urls[0],
        int_list(args.concurrency),
        args.requests,
        args.max_tokens,
        args.temperature,
        args.timeout_s,
        args.model,
    )
    if len(urls) > 1 and args.plot:
        raise ConfigError("--plot draws one server's levels: give one --url")
    prompts = None
    if args.prompts_file:
        prompts = [record.turns[0] for record in read_prompts_file(args.prompts_file)]

    def progress(level: dict, url: str = urls[0]) -> None:
        print(
            f"{url} concurrency {level['concurrency']}: {level['requests']} ok, "
            f"{level['errors']} errors, {level['tokens_per_s']:.1f} tok/s",
            file=sys.stderr,
        )

    try:
        if len(urls) == 1:
            report = asyncio.run(run_load(settings, prompts, progress))
        else:
            report = asyncio.run(
                run_load_in_turns(urls, settings, prompts, lambda u, lv: progress(lv, u))
            )
    except httpx.HTTPError as error:
        raise ConfigError(f"cannot reach a server at {', '.join(urls)}: {error}") from None
    if len(urls) == 1:
        print(load_table(report["levels"]))
    else:
        for server in report["servers"]:
            print(f"{server['url']} ({server['model']})\n{load_table(server['levels'])}\n")
        for pair in report["paired"]:
            ratio = pair["median_ratio"]
            shown = "-" if ratio is None else f"{ratio:.3f}"
            print(
                f"concurrency {pair['concurrency']}: {urls[pair['server']]} / {urls[0]} = "
                f"{shown} (median of {len(pair['ratios'])} rounds)"
            )
    if args.json_out:
        write_json(args.json_out, report)
        print(f"report: {args.json_out}", file=sys.stderr)
    if args.plot:
        from specpilot.bench.plots import serve_load_plot

        print(f"plot: {serve_load_plot(report, Path(args.plot))}", file=sys.stderr)
    return 0
