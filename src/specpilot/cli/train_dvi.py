"""`specpilot train-dvi`: train DVI's draft head online on a prompt stream (training.dvi).

The defaults of the training options are those of DviTrainConfig and TrainDviOptions, so the
dataclasses stay the one place they are set."""

from __future__ import annotations

import argparse
import sys

from specpilot.api import load_models
from specpilot.cli.common import VOCAB_CORPUS_HELP, dataclass_defaults
from specpilot.drafting.dvi_learning import DviTrainConfig
from specpilot.methods.defaults import DEFAULT_TARGET
from specpilot.models.loading import resolve_dtype
from specpilot.training.dvi.trainer import TrainDviOptions, train_dvi

DEFAULT_TRAIN_PROMPTS = "../shared/data/sharegpt_sample.jsonl"
"""Relative to the repository root, where the README runs commands."""
DEFAULT_STEPS = 2000


def register(commands) -> None:
    config, options = dataclass_defaults(DviTrainConfig), dataclass_defaults(TrainDviOptions)
    parser = commands.add_parser("train-dvi", help="train DVI's draft head online (KL→RL)")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="model to self-speculate")
    parser.add_argument(
        "--prompts",
        default=DEFAULT_TRAIN_PROMPTS,
        help="prompt stream, JSONL (default: ShareGPT in ../shared/data)",
    )
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="training steps")
    parser.add_argument("--out", required=True, help="folder for checkpoints, log and plot")
    parser.add_argument(
        "--objective", default=config["objective"], help="full (KL→RL), kl, pg or ce"
    )
    parser.add_argument(
        "--split", type=int, default=options["split"], help="target layers that draft"
    )
    parser.add_argument(
        "--draft-vocab", type=int, default=options["draft_vocab"], help="draft head scores N ids"
    )
    parser.add_argument("--draft-vocab-corpus", help=VOCAB_CORPUS_HELP)
    parser.add_argument(
        "--lora-rank", type=int, default=options["lora_rank"], help="LoRA rank r of the head"
    )
    parser.add_argument(
        "--limit", type=int, default=options["limit"], help="prompts read from the stream"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=options["max_new_tokens"], help="tokens per prompt"
    )
    parser.add_argument("--max-prompt-tokens", type=int, default=options["max_prompt_tokens"])
    parser.add_argument("--explore-temperature", type=float, default=options["explore_temperature"])
    parser.add_argument(
        "--train-batch", type=int, default=config["batch_size"], help="minibatch per update"
    )
    parser.add_argument(
        "--rollout-blocks", type=int, default=config["rollout_blocks"], help="blocks per step"
    )
    parser.add_argument(
        "--updates-per-step",
        type=int,
        default=config["updates_per_step"],
        help="optimizer updates per step (replay ratio)",
    )
    parser.add_argument("--lr", type=float, default=config["lr"])
    parser.add_argument(
        "--save-every",
        type=int,
        default=options["save_every"],
        help="steps between checkpoints",
    )
    parser.add_argument("--seed", type=int, default=config["seed"])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = DviTrainConfig(
        objective=args.objective,
        batch_size=args.train_batch,
        rollout_blocks=args.rollout_blocks,
        updates_per_step=args.updates_per_step,
        lr=args.lr,
        seed=args.seed,
    )
    options = TrainDviOptions(
        prompts=args.prompts,
        steps=args.steps,
        out=args.out,
        split=args.split,
        draft_vocab=args.draft_vocab,
        draft_vocab_corpus=args.draft_vocab_corpus,
        lora_rank=args.lora_rank,
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        explore_temperature=args.explore_temperature,
        save_every=args.save_every,
    )
    resolve_dtype(args.dtype, args.device)
    print(f"loading {args.target} ...", file=sys.stderr)
    target = load_models(args.target, None, args.dtype, args.device, args.max_length).target
    out = train_dvi(target, options, config, progress=not args.quiet)
    print(f"adapter: {out} (use --drafter dvi --dvi-adapter {out})", file=sys.stderr)
    return 0
