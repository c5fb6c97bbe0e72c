"""`specpilot import-head`: bring a public EAGLE-3 head (vLLM, SGLang or SpecForge layout) in as
a specpilot eagle head for --target, refusing with one error line what specpilot cannot run
(drafting.eagle3_format). The target is loaded to check the head against its shape, tokenizer
and embedding."""

from __future__ import annotations

import argparse

from specpilot.api import DEFAULT_TARGET, load_models
from specpilot.cli.export_head import DTYPES
from specpilot.drafting.eagle3_format import import_eagle3
from specpilot.drafting.eagle_head import HEADS, EagleShape
from specpilot.models.loading import resolve_dtype


def register(commands) -> None:
    parser = commands.add_parser("import-head", help="import a public EAGLE-3 head for a target")
    parser.add_argument("folder", help="the EAGLE-3 head (config.json, model.safetensors)")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="the model the head drafts for")
    parser.add_argument(
        "--out",
        help="folder for the specpilot head (default: install it in the cache as --target's "
        "head, which then drafts by default where no head is committed for it)",
    )
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="weights' dtype")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    target = load_models(args.target, None, "float32", max_length=64, backend="torch").target
    shape = EagleShape.for_target(target.runner, target.tokenizer)
    config = target.config.to_dict()
    head = import_eagle3(args.folder, shape, config, target.runner.embed)
    out = args.out or HEADS.installed(args.target)
    head.save(out, resolve_dtype(args.dtype))
    print(out)
    return 0
