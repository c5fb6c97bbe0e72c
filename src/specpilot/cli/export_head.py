"""`specpilot export-head`: write an eagle head as a public EAGLE-3 checkpoint that vLLM, SGLang
and llama.cpp load (drafting.eagle3_format; docs/guides/eagle3.md has the serving commands).

Only the target's config.json is read (rope settings, vocabulary), not its weights."""

from __future__ import annotations

import argparse
import json

from specpilot.api import DEFAULT_TARGET
from specpilot.bench.llama_cpp_eagle3 import NO_LAYER_INPUTS
from specpilot.drafting.eagle3_format import export_eagle3
from specpilot.drafting.eagle_head import EagleHead, resolve_head
from specpilot.models.loading import resolve_dtype, resolve_model_path

DTYPES = ("bfloat16", "float16", "float32")


def register(commands) -> None:
    parser = commands.add_parser(
        "export-head", help="write an eagle head in the EAGLE-3 format (vLLM, SGLang, llama.cpp)"
    )
    parser.add_argument("--target", default=DEFAULT_TARGET, help="the model the head drafts for")
    parser.add_argument(
        "--eagle-head", help="head folder or committed name (default: the target's committed head)"
    )
    parser.add_argument("--format", choices=("eagle3",), default="eagle3")
    parser.add_argument("--out", required=True, help="folder for config.json and model.safetensors")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="weights' dtype")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    head = EagleHead.load(resolve_head(args.eagle_head, args.target))
    target_config = json.loads((resolve_model_path(args.target) / "config.json").read_text())
    out = export_eagle3(head, target_config, args.out, resolve_dtype(args.dtype))
    engines = "vLLM only" if head.shape.attention_bias else "vLLM, SGLang and llama.cpp"
    if not head.shape.attention_bias and head.shape.model_type in NO_LAYER_INPUTS:
        engines = f"vLLM and SGLang; llama.cpp cannot tap a {head.shape.model_type} target"
    print(f"wrote {out} (a head with{'' if head.shape.attention_bias else 'out'} a q/k/v "
          f"bias: for {engines})")  # fmt: skip
    return 0
