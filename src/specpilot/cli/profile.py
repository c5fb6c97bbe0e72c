"""`specpilot profile`: verify latency curves, draft cost and acceptance (bench.profile)."""

from __future__ import annotations

import argparse
import sys

from specpilot.cli.common import add_backend_argument, add_model_arguments, int_list, load_from_args
from specpilot.config import GenerationConfig
from specpilot.models.backends import choose_backend


def register(commands) -> None:
    parser = commands.add_parser("profile", help="measure verify latency, draft cost, acceptance")
    add_model_arguments(parser, 48, "new tokens per speculative run (default %(default)s)")
    add_backend_argument(parser)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--contexts", default="128,512,1024", help="context lengths for T(n)")
    parser.add_argument("--max-verify", type=int, default=64, help="largest n in T_target(n)")
    parser.add_argument("--gammas", default="1,2,3,4,5", help="draft lengths to run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-draft", action="store_true", help="only the target latency curve")
    parser.add_argument(
        "--eagle-head",
        help="also time the eagle drafter with this head (a folder, or 'default' for the head "
        "committed for the target)",
    )
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specpilot.bench.profile import profile_pair, profile_table
    from specpilot.bench.run import write_json
    from specpilot.methods.goodput import profile_cache_path

    contexts, gammas = int_list(args.contexts), int_list(args.gammas)
    GenerationConfig(args.max_new_tokens)  # validate before loading
    # auto: the backend generate would run on (ggml for a GGUF target), whose curve the goodput
    # controller reads; the eagle drafter runs there too.
    backend = choose_backend(args.model_backend, args.target, args.device, True)
    models = load_from_args(args, None if args.no_draft else args.draft, backend=backend)
    profile = profile_pair(
        models,
        contexts,
        args.max_verify,
        gammas,
        args.repeats,
        args.max_new_tokens,
        progress=not args.quiet,
        eagle_head=args.eagle_head,
    )
    write_json(args.out, profile)
    runner = models.target.runner
    cached = profile_cache_path(models.target.name, runner.dtype, runner.backend)
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_json(cached, profile)  # the goodput controller's prior for this target and backend
    print(profile_table(profile))
    print(f"profile: {args.out}", file=sys.stderr)
    return 0
