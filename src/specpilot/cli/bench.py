"""`specpilot bench`: plain decoding and every --method on identical prompts (bench.run)."""

from __future__ import annotations

import argparse
import json
import sys

from specpilot.cli.common import (
    BATCH_HELP,
    add_backend_argument,
    add_model_arguments,
    generation_config,
    load_from_args,
)
from specpilot.errors import ConfigError
from specpilot.models.backends import choose_backend


def register(commands) -> None:
    parser = commands.add_parser(
        "bench", help="compare methods against plain decoding on prompt files"
    )
    add_model_arguments(parser, 128)
    add_backend_argument(parser)
    parser.add_argument(
        "--prompts", action="append", default=[], help="JSONL prompt file (repeatable)"
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="N prompts per category (the first N, or --seed)"
    )
    parser.set_defaults(seed=None)
    parser.add_argument(
        "--max-turns", type=int, default=None, help="answer at most N turns per prompt"
    )
    parser.add_argument(
        "--method",
        action="append",
        default=[],
        help="NAME[:key=value,...]: ar, default, sd, hf, hf-assisted, hf-pld, llama-cpp "
        "(repeatable)",
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=1, help=BATCH_HELP)
    parser.add_argument("--json-out", help="write the JSON report here too")
    parser.add_argument("--plots", help="PNG path prefix (default: next to --json-out)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specpilot.bench.methods import load_hf_models
    from specpilot.bench.report import table
    from specpilot.bench.run import (
        BenchSettings,
        bench_methods,
        run_bench,
        select_prompts,
        write_report_plots,
    )

    settings = BenchSettings(
        tuple(args.prompts), args.limit, args.seed, args.max_turns, args.repeats, args.batch_size
    )
    specs = bench_methods(args.method, args.batch_size, args.target)
    config = generation_config(args)
    if not args.prompts:
        raise ConfigError(
            "give at least one --prompts FILE.jsonl (e.g. ../shared/data/mt_bench_question.jsonl)"
        )
    records = select_prompts(args.prompts, args.limit, args.max_turns, args.seed)
    draft = args.draft if any(s.needs_draft for s in specs) else None
    # auto: ggml for a GGUF target when every method runs there (transformers' peers need the
    # torch weights), as generate decides for its one method.
    on_ggml = all(_runs_on_ggml(s) for s in specs)
    backend = choose_backend(args.model_backend, args.target, args.device, on_ggml)
    models = load_from_args(args, draft, settings.batch_size, backend)
    document = run_bench(
        models,
        specs,
        records,
        config,
        settings,
        json_out=args.json_out,
        progress=not args.quiet,
        hf_models=load_hf_models(models, specs),
    )
    print(table(document["results"]))
    for path in write_report_plots(document["results"], args.plots, args.json_out):
        print(f"plot: {path}", file=sys.stderr)
    print(json.dumps(document))
    return 0


def _runs_on_ggml(method) -> bool:
    """Whether a bench method runs on the ggml backend (llama.cpp's own binary reads the GGUF
    whatever specpilot's runner is)."""
    if method.kind == "llama-cpp":
        return True
    return method.spec is not None and method.spec.runs_on_ggml
