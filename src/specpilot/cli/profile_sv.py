"""`specpilot profile-sv`: record the acceptance table `--policy sv` plans with
(bench.profile_sv)."""

from __future__ import annotations

import argparse
import sys

from specpilot.cli.common import (
    add_backend_argument,
    add_model_arguments,
    generation_config,
    load_from_args,
)
from specpilot.errors import ConfigError
from specpilot.methods.defaults import SV_GAMMA_MAX
from specpilot.models.backends import choose_backend


def register(commands) -> None:
    parser = commands.add_parser("profile-sv", help="record SV's acceptance table for --policy sv")
    add_model_arguments(parser, 64, "new tokens per profiling prompt (default %(default)s)")
    add_backend_argument(parser)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument(
        "--companion",
        default="early-exit:target:8",
        help="model sharing the tokenizer, or early-exit:target:N / early-exit:draft:N",
    )
    parser.add_argument(
        "--gamma-max", type=int, default=SV_GAMMA_MAX, help="tokens drafted per step"
    )
    parser.add_argument(
        "--prompts", action="append", default=[], help="prompt file(s) (default: built-in set)"
    )
    parser.add_argument("--limit", type=int, default=None, help="N prompts per category")
    parser.add_argument("--latency-profile", help="take T(n) from this `specpilot profile` JSON")
    parser.add_argument("--max-verify", type=int, default=64, help="largest n measured for T(n)")
    parser.add_argument("--s-bins", type=int, default=16)
    parser.add_argument("--a-bins", type=int, default=16)
    parser.add_argument("--min-count", type=int, default=20, help="sparser cells fall back")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specpilot.bench.profile_sv import (
        SV_PROFILE_PROMPTS,
        profile_summary,
        profile_sv,
        read_verify_ms,
    )
    from specpilot.bench.run import select_prompts, write_json

    config = generation_config(args)
    if args.gamma_max < 1:
        raise ConfigError(f"--gamma-max must be >= 1, got {args.gamma_max}")
    if args.prompts:
        prompts = [record.turns[0] for record in select_prompts(args.prompts, args.limit, 1)]
    else:
        prompts = list(SV_PROFILE_PROMPTS)
    verify_ms = read_verify_ms(args.latency_profile) if args.latency_profile else None
    # auto: the backend `--policy sv` decodes on (ggml for a GGUF target), whose costs it plans with
    backend = choose_backend(args.model_backend, args.target, args.device, True)
    models = load_from_args(args, args.draft, backend=backend)
    profile = profile_sv(
        models,
        args.companion,
        prompts,
        config,
        args.gamma_max,
        (args.s_bins, args.a_bins),
        args.min_count,
        verify_ms,
        args.max_verify,
        progress=not args.quiet,
    )
    write_json(args.out, profile)
    print(profile_summary(profile))
    print(f"sv profile: {args.out}", file=sys.stderr)
    return 0
