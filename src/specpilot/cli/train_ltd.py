"""`specpilot train-ltd`: record replay logs, then train LTD's depth and size policies (PPO).

Re-running the same command on the same --out resumes: recorded prompts are skipped, the cost
model is reused, finished stages are skipped and an interrupted stage continues from its
checkpoint. Training defaults are LtdTrainConfig's (the LTD paper's PPO settings).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specpilot.api import load_models
from specpilot.cli.common import add_backend_argument, dataclass_defaults
from specpilot.cli.train_eagle import DEFAULT_DATA_DIR
from specpilot.config import require
from specpilot.methods.defaults import DEFAULT_TARGET
from specpilot.models.chat import encode_prompt, eos_token_ids
from specpilot.policies.ltd_net import LtdShape
from specpilot.training.ltd.config import REWARDS, LtdTrainConfig

FLOATS = ("ent_coef", "lr", "warmup", "gamma_size", "gamma_depth", "valid_fraction")


def register(commands) -> None:
    parser = commands.add_parser(
        "train-ltd", help="train LTD's draft-tree depth and size policies for a target"
    )
    parser.add_argument("--target", default=DEFAULT_TARGET, help="the model to draft for")
    parser.add_argument(
        "--eagle-head", help="the feature drafter's head (default: the target's committed head)"
    )
    parser.add_argument("--out", required=True, help="folder for logs, checkpoints, policies")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="training prompt files")
    parser.add_argument("--prompts", type=int, default=64, help="training prompts recorded")
    parser.add_argument(
        "--new-tokens", type=int, default=128, help="decoding positions recorded per prompt"
    )
    parser.add_argument("--max-prompt-tokens", type=int, default=768)
    parser.add_argument(
        "--profile",
        help="`specpilot profile --out` JSON (with --eagle-head: also the draft cost) for the cost "
        "model (default: verify measured at a few sizes, draft time as recorded)",
    )
    shape = LtdShape()
    parser.add_argument("--topk", type=int, default=shape.topk, help="tree frontier width W")
    parser.add_argument("--max-depth", type=int, default=shape.max_depth, help="most tree levels")
    parser.add_argument(
        "--size-step", type=int, default=shape.size_step, help="V = size_step·(a+1)"
    )
    parser.add_argument(
        "--size-actions", type=int, default=shape.size_actions, help="size actions (paper: 12)"
    )
    defaults = dataclass_defaults(LtdTrainConfig)
    parser.add_argument("--reward", choices=REWARDS, default=defaults["reward"])
    for name, value in defaults.items():
        if name == "reward":
            continue
        kind = float if name in FLOATS else int
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=value)
    parser.add_argument("--dtype", default="auto", help="the target's dtype (as when decoding)")
    parser.add_argument("--max-length", type=int, default=2048)
    add_backend_argument(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specpilot.methods import make_drafter
    from specpilot.training.eagle.data import DataOptions, training_prompts
    from specpilot.training.ltd.cost import (
        CostModel,
        draft_curve,
        draft_from_profile,
        measure_verify,
        verify_from_profile,
    )
    from specpilot.training.ltd.replay import RecordOptions, ReplayLog, record_replay
    from specpilot.training.ltd.trainer import LtdTrainConfig, train_ltd

    shape = LtdShape(args.topk, args.max_depth, args.size_step, args.size_actions)
    config = LtdTrainConfig(
        **{name: getattr(args, name) for name in dataclass_defaults(LtdTrainConfig)}
    )
    record = RecordOptions(new_tokens=args.new_tokens)
    data = DataOptions(data_dir=args.data_dir, max_prompts=max(args.prompts, 1),
                       max_prompt_tokens=args.max_prompt_tokens)  # fmt: skip
    require(args.prompts >= 2, f"--prompts must be >= 2 (train and validation), got {args.prompts}")
    prompts = training_prompts(data)  # checks the data before the model loads
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_config.json").write_text(
        json.dumps({"target": args.target, **vars(args) | {"run": None}}, indent=1) + "\n"
    )
    # --backend ggml records on llama.cpp's kernels; the cost model then measures that backend's
    # verify curve (or reads it from a --profile taken there)
    models = load_models(
        args.target, None, args.dtype, max_length=args.max_length, backend=args.model_backend
    )
    target = models.target
    tree = {"tree_depth": shape.max_depth, "tree_topk": shape.topk}
    head = {} if args.eagle_head is None else {"eagle_head": args.eagle_head}
    drafter = make_drafter("eagle", models, **head, **tree)
    encoded = [(pid, encode_prompt(target.tokenizer, text)) for pid, text in prompts]
    encoded = [(pid, ids) for pid, ids in encoded if len(ids) <= args.max_prompt_tokens]
    print(f"replay logs: {len(encoded)} training prompts × {args.new_tokens} positions",
          file=sys.stderr)  # fmt: skip
    record_replay(
        target.runner,
        target.tokenizer,
        drafter,
        shape,
        encoded,
        out / "replay",
        record,
        eos_ids=eos_token_ids(target.tokenizer, target.path),
        progress=not args.quiet,
    )
    log = ReplayLog.load(out / "replay", shape)
    cost_path = out / "cost.json"
    if cost_path.is_file():
        cost = CostModel.load(cost_path)
    else:
        draft = draft_curve(log.draft_ms)
        source = "draft: recorded"
        if args.profile:
            contexts, sizes, ms = verify_from_profile(args.profile)
            source += f"; verify: profile {args.profile}"
            profiled = draft_from_profile(args.profile, shape.max_depth)
            if profiled is not None:
                draft, source = profiled, f"draft and verify: profile {args.profile}"
        else:
            contexts, sizes, ms = measure_verify(target.runner, progress=not args.quiet)
            source += "; verify: measured by train-ltd"
        cost = CostModel(draft, contexts, sizes, ms, source)
        cost.save(cost_path)
    print(f"training on {len(log)} recorded positions", file=sys.stderr)
    summary = train_ltd(log, cost, out, config, target=target.name, progress=not args.quiet)
    best, ltd = summary["static"]["best_static"], summary["ltd"].get("both")
    print(
        f"replay validation: best static (depth {best['depth']}, V {best['size']}) "
        f"{best['tokens_per_s']:.1f} tok/s"
        + (f", LTD {ltd['tokens_per_s']:.1f} tok/s" if ltd else ""),
        file=sys.stderr,
    )
    print(out / "policies")
    return 0
