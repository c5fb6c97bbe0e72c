"""`specpilot train-ppow`: PPOW fine-tuning of a feature-drafter head (training.ppow), or with
`--baseline distill` its baseline, continued distillation of the same head for as many updates.

Every PpowConfig field is a flag (`--window`, `--group`, `--gamma`, `--no-adaw`, ...) defaulting
to the dataclass. Re-running the same command on the same --out resumes.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
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
from specpilot.training.eagle.trainer import EagleTrainConfig, write_run_config
from specpilot.training.ppow import PpowConfig, continued_distillation, train_ppow
from specpilot.training.ppow.config import (
    ACCEPTANCE,
    KL_DIRECTIONS,
    PROX_FORMS,
    PROX_REFERENCES,
)

DEFAULT_DATA_DIR = "../shared/data"
CHOICES = {
    "acceptance": ACCEPTANCE,
    "kl_direction": KL_DIRECTIONS,
    "prox_form": PROX_FORMS,
    "prox_reference": PROX_REFERENCES,
}
HELP = {
    "updates": "optimizer updates",
    "windows_per_update": "prefixes (rollout groups) per update",
    "window": "K, drafted tokens per window",
    "group": "G, windows sampled per prefix",
    "temperature": "rollout temperature (the target is judged at the same)",
    "gamma": "relative drafter cost in k/(kγ+1): a number (the paper's: 0.12) or 'measured' "
    "(a head step's time over a target step's, once per run)",
    "acceptance": "accepted length: rejection sampling, its expectation, or greedy matches",
    "proximity": "proximity reward for windows with no accepted token",
    "prox_alpha": "proximity reward size α",
    "prox_delta": "proximity tolerance δ (nats)",
    "prox_form": "indicator α·1[Δ<δ] or soft α·max(0, 1−Δ/δ)",
    "prox_mean": "Δ per token (÷K) instead of summed over the window",
    "prox_absolute": "Δ = |L(ŷ) − L(y)| instead of max(0, L(ŷ) − L(y))",
    "prox_reference": "ŷ: the training response's next K tokens (the target's greedy answer) or "
    "K greedy target steps",
    "clip_eps": "ratio clip ε",
    "kl_beta": "KL coefficient β",
    "kl_direction": "reverse = KL(Q‖P), forward = KL(P‖Q)",
    "ppo_epochs": "gradient steps per batch of rollouts",
    "adv_eps": "advantage normaliser's ε",
    "lr": "AdamW peak learning rate",
    "warmup_ratio": "share of updates in linear warm-up (then cosine to 10%%)",
    "clip_grad": "gradient-norm clip",
    "adaw": "adaptive divergence-aware windowing (off: uniform windows)",
    "adaw_pool": "share of windows (most critical) in the hard pool",
    "adaw_curriculum": "hard-window fractions of equal stages, e.g. 0.2,0.4,0.6",
    "adaw_start": "updates of uniform windows before ADAW starts",
    "adaw_refresh": "rescore the windows every N updates",
    "adaw_sequences": "sequences scored per refresh, a random subset (one target prefill each: "
    "cap it on large targets; None: all)",
    "valid_samples": "held-out sequences (the last ones) for the eval metrics",
    "max_seq_tokens": "longest training sequence",
    "eval_every": "updates between held-out evaluations",
    "save_every": "updates between checkpoints",
    "seed": "seed of window choice and sampling",
    "bf16": "head matrix products in bf16 autocast (None: where the CPU computes bf16 natively)",
}


def _gamma(text: str) -> float | None:
    if text == "measured":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'measured', got {text!r}") from None


def _fractions(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers like 0.2,0.4,0.6, got {text!r}"
        ) from None


def register(commands) -> None:
    parser = commands.add_parser(
        "train-ppow",
        help="fine-tune a feature-drafter head with window-level RL (PPOW), or its "
        "continued-distillation baseline",
    )
    parser.add_argument("--target", default=DEFAULT_TARGET, help="the model to draft for")
    parser.add_argument(
        "--init",
        help="the head to start from: a head or train-eagle/train-ppow --out folder, or a "
        "committed name (default: the eagle head committed for the target)",
    )
    parser.add_argument("--out", required=True, help="folder for data, checkpoints, log, head")
    parser.add_argument(
        "--baseline",
        choices=("none", "distill"),
        default="none",
        help="distill: continue the eagle trainer's distillation from --init instead, for "
        "--updates updates at --lr on the same samples (the baseline PPOW is compared with)",
    )
    parser.add_argument(
        "--distill-batch-tokens",
        type=int,
        default=dataclass_defaults(EagleTrainConfig)["batch_tokens"],
        help="--baseline distill: scored positions per update",
    )
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="training prompt files")
    parser.add_argument(
        "--responses",
        help="reuse the target's answers in this folder (a train-eagle or train-ppow --out, or "
        "its data/) instead of generating them into OUT/data",
    )
    parser.add_argument(
        "--regenerate", type=int, default=512, help="training prompts the target answers"
    )
    parser.add_argument(
        "--reference",
        type=int,
        default=0,
        help="training-set reference answers added (needs --prox-reference greedy: they are "
        "not the target's own windows)",
    )
    add_answer_generation_flags(parser)
    _add_config_flags(parser)
    parser.add_argument("--dtype", default="auto", help="the target's dtype")
    add_feature_cache_flag(parser)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(run=run)


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per PpowConfig field, defaulting to the dataclass."""
    defaults = dataclass_defaults(PpowConfig)
    hints = typing.get_type_hints(PpowConfig)
    for field in dataclasses.fields(PpowConfig):
        name, kind = field.name, hints[field.name]
        flag = f"--{name.replace('_', '-')}"
        options = {"default": defaults[name], "help": HELP[name] + " (default: %(default)s)"}
        if name == "gamma":
            options |= {"type": _gamma, "metavar": "NUMBER|measured"}
        elif bool in (kind, *typing.get_args(kind)):  # bool, or bool | None (None: auto)
            options["action"] = argparse.BooleanOptionalAction
        elif name == "adaw_curriculum":
            options["type"] = _fractions
        elif name in CHOICES:
            options["choices"] = CHOICES[name]
        else:  # int, float, or an optional one (`X | None`: the flag gives an X)
            options["type"] = next(
                t for t in typing.get_args(kind) or (kind,) if t is not type(None)
            )
        parser.add_argument(flag, **options)


def run(args: argparse.Namespace) -> int:
    config = PpowConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PpowConfig)})
    if args.reference > 0 and config.prox_reference == "response" and args.baseline == "none":
        raise ConfigError(
            "--reference answers are not the target's own words, so their next K tokens are no "
            "target-preferred window: add --prox-reference greedy or use --reference 0"
        )
    if (
        args.gen_temperature > 0
        and config.proximity
        and config.prox_reference == "response"
        and args.baseline == "none"
    ):
        raise ConfigError(
            "answers sampled at --gen-temperature are not the target's preferred (greedy) "
            "windows that the proximity reward measures against: add --prox-reference greedy "
            "or --no-proximity"
        )
    models = load_models(
        args.target, None, args.dtype, max_length=args.max_length, batch_size=args.gen_batch_size
    )
    target = models.target
    expected = EagleShape.for_target(target.runner, target.tokenizer)
    init = EagleHead.load(resolve_head(args.init, target.name), expected=expected)
    out = Path(args.out)
    write_run_config(out, {"target": args.target, **vars(args) | {"run": None}})
    data = DataOptions(
        data_dir=args.data_dir,
        max_prompts=max(args.regenerate, 1),
        max_new_tokens=args.gen_max_new_tokens,
        batch_size=args.gen_batch_size,
        temperature=args.gen_temperature,
    )
    answered = None
    if args.responses is not None:
        answered = answers_in(args.responses, "--responses", "leave it out to generate them")
    answerer = answering_model(args) if answered is None and args.regenerate else None
    samples = collect_samples(
        target, data, args.regenerate, args.reference, out / "data", config.max_seq_tokens,
        not args.quiet, answered, answerer,
        feature_cache_of(args, target.runner, init.shape.feature_layers),
    )  # fmt: skip
    if args.baseline == "distill":
        continued_distillation(
            target, samples, out, config, init, args.distill_batch_tokens, not args.quiet,
            args.feature_cache,
        )  # fmt: skip
    else:
        train_ppow(
            target, samples, out, config, init, not args.quiet, args.feature_cache
        )  # fmt: skip
    print(out / "head")
    return 0
