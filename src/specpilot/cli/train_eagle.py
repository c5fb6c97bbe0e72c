"""`specpilot train-eagle`: distil the target into a feature-drafter head (training.eagle).

Re-running the same command on the same --out resumes: the target's answers already written are
kept, and training continues from the last checkpoint. Training defaults are EagleTrainConfig's.
`--init HEAD` starts from a trained head instead of the target's top layer: how a head grows
over several sessions, each answering more prompts (copy the last run's data/responses.jsonl
into the new --out/data to keep its answers).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from specpilot.api import load_models
from specpilot.cli.common import (
    add_answer_generation_flags,
    add_feature_cache_flag,
    answering_model,
    answers_in,
    dataclass_defaults,
    feature_cache_of,
)
from specpilot.drafting.eagle_head import EagleHead, EagleShape, resolve_head
from specpilot.errors import ConfigError
from specpilot.methods.defaults import DEFAULT_TARGET
from specpilot.training.eagle.data import DataOptions, collect_samples
from specpilot.training.eagle.trainer import EagleTrainConfig, train_eagle, write_run_config

DEFAULT_DATA_DIR = "../shared/data"
"""Relative to the repository root, where the README runs commands."""


def _int_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def register(commands) -> None:
    defaults = dataclass_defaults(EagleTrainConfig)
    parser = commands.add_parser(
        "train-eagle", help="train a feature-drafter head (EAGLE-3) for a target"
    )
    parser.add_argument("--target", default=DEFAULT_TARGET, help="the model to draft for")
    parser.add_argument("--out", required=True, help="folder for data, checkpoints, log, head")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="training prompt files")
    parser.add_argument(
        "--regenerate",
        type=int,
        default=512,
        help="training prompts the target answers (its own answers are the best data)",
    )
    parser.add_argument(
        "--reference",
        type=int,
        default=2000,
        help="training-set reference answers added (cheap: a prefill each, no decoding)",
    )
    parser.add_argument(
        "--skip-prompts",
        type=int,
        default=0,
        help="leave out the first N training prompts (those an earlier run answered, whose head "
        "--init continues), so the target answers new ones",
    )
    add_answer_generation_flags(parser)
    parser.add_argument(
        "--valid-responses",
        metavar="DIR",
        help="score the head on these held-out answers (a folder with a responses.jsonl, e.g. "
        "the target's answers to the benchmark prompts, docs/eagle/data/qwen15_heldout) instead "
        "of the last --valid-samples of the data, which then all trains",
    )
    parser.add_argument(
        "--draft-vocab",
        type=int,
        help="draft vocabulary size (default: 32768 above 50k ids, else the whole vocabulary)",
    )
    parser.add_argument(
        "--head-intermediate",
        type=int,
        help="the head's MLP width (default: the target's; narrower keeps a large head small)",
    )
    parser.add_argument(
        "--feature-layers",
        type=_int_tuple,
        help="tap layers, e.g. 2,14,25 (default: inputs of layers 2, L/2, L-3)",
    )
    parser.add_argument(
        "--init",
        help="continue training this head (a head or train-eagle --out folder, or `default`: "
        "the head committed for the target) instead of starting from the target's top layer; "
        "its draft vocabulary, taps and MLP width are kept",
    )
    parser.add_argument(
        "--no-qkv-bias",
        action="store_true",
        help="a head without the q/k/v bias a Qwen target has: exported, it runs in vLLM, SGLang "
        "and (for targets other than Qwen2) llama.cpp; a biased head runs in vLLM only (see "
        "`specpilot export-head`)",
    )
    integers = ("epochs", "batch_tokens", "unroll", "max_seq_tokens", "valid_samples")
    for name in (*integers, "eval_every", "save_every"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=defaults[name])
    for name in ("lr", "step_decay"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=defaults[name])
    parser.add_argument("--seed", type=int, default=defaults["seed"])
    parser.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        help="head matrix products in bf16 autocast (default: where the CPU computes bf16 "
        "natively; emulated bf16 is ~9x slower than float32)",
    )
    parser.add_argument("--dtype", default="auto", help="the target's dtype for features")
    add_feature_cache_flag(parser)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    valid = None  # the data's last answers
    if args.valid_responses is not None:
        remedy = "write the held-out answers with scripts/eagle/accept_by_category.py"
        valid = answers_in(args.valid_responses, "--valid-responses", remedy)
    config = EagleTrainConfig(
        epochs=args.epochs,
        lr=args.lr,
        batch_tokens=args.batch_tokens,
        unroll=args.unroll,
        step_decay=args.step_decay,
        max_seq_tokens=args.max_seq_tokens,
        valid_samples=args.valid_samples,
        eval_every=args.eval_every,
        save_every=args.save_every,
        seed=args.seed,
        bf16=args.bf16,
    )
    data = DataOptions(
        data_dir=args.data_dir,
        max_prompts=max(args.regenerate, args.reference, 1),
        skip=args.skip_prompts,
        max_new_tokens=args.gen_max_new_tokens,
        batch_size=args.gen_batch_size,
        temperature=args.gen_temperature,
    )
    models = load_models(
        args.target, None, args.dtype, max_length=args.max_length, batch_size=args.gen_batch_size
    )
    target = models.target
    init = _initial_head(args, target)
    shape = (
        init.shape
        if init is not None
        else EagleShape.for_target(
            target.runner,
            target.tokenizer,
            args.feature_layers,
            args.draft_vocab,
            args.head_intermediate,
        )
    )
    if args.no_qkv_bias:
        shape = replace(shape, attention_bias=False)
    out = Path(args.out)
    write_run_config(out, {"target": args.target, **vars(args) | {"run": None}})
    samples = collect_samples(
        target, data, args.regenerate, args.reference, out / "data", config.max_seq_tokens,
        progress=not args.quiet, answerer=answering_model(args) if args.regenerate else None,
        feature_cache=feature_cache_of(args, target.runner, shape.feature_layers),
    )  # fmt: skip
    train_eagle(
        target, samples, out, config, shape, progress=not args.quiet, init=init,
        feature_cache=args.feature_cache, valid=valid,
    )  # fmt: skip
    print(out / "head")
    return 0


def _initial_head(args: argparse.Namespace, target) -> EagleHead | None:
    """The head `--init` names, checked against the target; the shape options belong to it."""
    if args.init is None:
        return None
    options = ("draft-vocab", "head-intermediate", "feature-layers", "no-qkv-bias")
    chosen = [f"--{name}" for name in options
              if getattr(args, name.replace("-", "_")) not in (None, False)]  # fmt: skip
    if chosen:
        raise ConfigError(
            f"--init keeps the head's own shape; drop {', '.join(chosen)} (or train a new head "
            "without --init)"
        )
    committed = None if args.init == "default" else args.init
    expected = EagleShape.for_target(target.runner, target.tokenizer)
    return EagleHead.load(resolve_head(committed, target.name), expected=expected)
