"""Argument groups and helpers shared by the commands: model and decoding options, method
(drafter and policy) options, and loading the models they name."""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields
from functools import partial
from pathlib import Path

import torch

from specpilot.api import ModelPair, build_engine, load_models
from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.errors import ConfigError
from specpilot.methods import DRAFTERS, POLICIES, MethodSpec
from specpilot.methods.defaults import (
    DEFAULT_DEPTH,
    DEFAULT_DRAFT,
    DEFAULT_K,
    DEFAULT_NODES,
    DEFAULT_TARGET,
    DEFAULT_TOPK,
    DVI_SPLIT,
    EAGLE_BF16_LOOKUP,
    default_drafter,
)
from specpilot.models.backends import choose_backend
from specpilot.models.loading import BACKENDS, resolve_dtype
from specpilot.training.eagle.data import RESPONSES_FILE, Sample, read_samples
from specpilot.training.eagle.feature_cache import FeatureCache

BATCH_HELP = "prompts decoded together (each row accepts its own number of tokens per step)"
VOCAB_CORPUS_HELP = (
    "with --draft-vocab N: the N tokens most frequent in this text or JSONL file "
    "(default: the first N ids)"
)


def add_model_arguments(
    parser: argparse.ArgumentParser,
    max_new_tokens: int,
    max_new_tokens_help: str = "new tokens per answer (default %(default)s)",
) -> None:
    """Model and decoding options shared by generate, bench and profile."""
    parser.add_argument(
        "--target", default=DEFAULT_TARGET, help="offline name, HF id/folder or .gguf"
    )
    parser.add_argument(
        "--draft", default=DEFAULT_DRAFT, help="draft model (same tokenizer as the target)"
    )
    parser.add_argument(
        "--dtype", default="auto", help="auto (bf16 where the CPU has it), bfloat16, float32, ..."
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--max-length", type=int, default=4096, help="KV cache size (context) in tokens"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=max_new_tokens, help=max_new_tokens_help
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument(
        "--seed", type=int, default=0, help="sampling seed (bench: also draws the --limit sample)"
    )


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    """--backend: where the models run (models.loading.BACKENDS, models.backends)."""
    parser.add_argument(
        "--backend",
        dest="model_backend",
        choices=BACKENDS,
        default="auto",
        help="ggml: llama.cpp over the GGUF as stored; torch: the lean decoder; hf: transformers; "
        "auto (default): ggml for a GGUF target on the CPU when the method runs there, else torch",
    )


def _method_on_ggml(args: argparse.Namespace) -> bool:
    """Whether the command's method flags name a method that runs on the ggml backend
    (models.backends.runs_on_ggml); commands without them (training) stay on torch. bench
    decides for its --method strings itself."""
    if not hasattr(args, "drafter"):
        return False
    return method_spec(args).runs_on_ggml


def add_method_arguments(parser: argparse.ArgumentParser) -> None:
    """Which drafter and policies decode (see `method_spec`)."""
    parser.add_argument(
        "--drafter",
        choices=DRAFTERS,
        help="none = plain decoding (default: eagle where the target has a head, committed or "
        "installed by import-head, else model: the --draft model)",
    )
    parser.add_argument(
        "--draft-vocab",
        type=int,
        default=None,
        help="draft scores only N token ids (+ specials): a cheaper draft head",
    )
    parser.add_argument("--draft-vocab-corpus", help=VOCAB_CORPUS_HELP)
    parser.add_argument(
        "--branches",
        type=int,
        default=None,
        help="--drafter model/dvi: verify the draft's top N first tokens, a tree (default 1: a "
        "chain)",
    )
    parser.add_argument(
        "--policy",
        choices=sorted(POLICIES),
        help="default: what measured best for the drafter, backend and batch size "
        "(methods.defaults.default_policy); constant with --k",
    )
    parser.add_argument(
        "--k",
        type=int,
        default=None,
        help=f"draft length for --policy constant ({DEFAULT_K}; alone it picks constant)",
    )
    parser.add_argument(
        "--policy-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra policy option, e.g. max_k=20 (repeatable)",
    )
    parser.add_argument(
        "--companion",
        help="SV companion (--policy sv, or goodput with SV): a model sharing the tokenizer, or "
        "early-exit:target:N / draft:N (default: the one in --sv-profile)",
    )
    parser.add_argument("--sv-profile", help="SV acceptance profile from `specpilot profile-sv`")
    parser.add_argument(
        "--ltd-policies",
        help="--policy ltd: a `train-ltd --out` folder (default: the policies committed for the "
        "target); options use=both|depth|size, check_every=N via --policy-option",
    )
    parser.add_argument(
        "--dvi-adapter", help="--drafter dvi: a trained head (`train-dvi --out` folder or adapter)"
    )
    parser.add_argument(
        "--dvi-split",
        type=int,
        help=f"--drafter dvi: target layers that draft (default: the adapter's, else {DVI_SPLIT})",
    )
    parser.add_argument(
        "--eagle-head",
        help="--drafter eagle: a `train-eagle`/`train-ppow --out` folder, a head folder, or the "
        "name of a head committed beside the target's (e.g. ppow; default: the target's own)",
    )
    parser.add_argument(
        "--tree-depth",
        type=int,
        help=f"--drafter eagle: draft levels per step (default {DEFAULT_DEPTH})",
    )
    parser.add_argument(
        "--eagle-lookup",
        type=int,
        help="--drafter eagle: also verify up to N tokens copied by prompt lookup (what followed "
        "the last earlier occurrence of the text's final n-gram) as one more tree branch "
        f"(default: {EAGLE_BF16_LOOKUP} with no --policy, --k or --batch-size where the target "
        "computes in bf16 on the CPU, else 0: none)",
    )
    parser.add_argument(
        "--tree-topk",
        type=int,
        help="--drafter eagle/model: frontier width, the nodes expanded per level (eagle default "
        f"{DEFAULT_TOPK}; 1 drafts chains)",
    )
    parser.add_argument(
        "--tree-nodes",
        type=int,
        help=f"--drafter eagle/model: tokens verified (default {DEFAULT_NODES})",
    )


METHOD_FLAGS = (
    "draft_vocab",
    "draft_vocab_corpus",
    "branches",
    "k",
    "companion",
    "sv_profile",
    "ltd_policies",
    "dvi_adapter",
    "dvi_split",
    "eagle_head",
    "tree_depth",
    "eagle_lookup",
    "tree_topk",
    "tree_nodes",
)
"""The method flags that are drafter or policy options, by the option's name (a flag not given
is None and leaves the option unset)."""


def method_spec(args: argparse.Namespace, learn: bool = False) -> MethodSpec:
    """The method the flags name (`learn`: DVI's --learn), validated before any model loads."""
    options = {name: getattr(args, name) for name in METHOD_FLAGS}
    for item in args.policy_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--policy-option expects KEY=VALUE, got {item!r}")
        options[key] = value
    if learn:
        options["learn"] = True
    return MethodSpec.of(args.drafter or default_drafter(args.target), args.policy, **options)


def engine_builder(args: argparse.Namespace, learn: bool = False):
    """The flags' method spec, checked before any model is loaded: return the draft model to load
    (None when the drafter needs none) and `build(models)`, which makes its engine."""
    spec = method_spec(args, learn)
    return (args.draft if spec.needs_draft else None), partial(build_engine, drafter=spec)


def generation_config(args: argparse.Namespace, stop: tuple[str, ...] = ()) -> GenerationConfig:
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    seed = 0 if args.seed is None else args.seed  # bench's --seed defaults to None
    return GenerationConfig(args.max_new_tokens, sampling, seed, stop)


def batch_size(size: int) -> int:
    """--batch-size, checked."""
    if size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {size}")
    return size


def load_from_args(
    args: argparse.Namespace, draft: str | None, batch: int = 1, backend: str = "auto"
) -> ModelPair:
    """Load the target (and draft) named on the command line, with cache room for `batch`
    prompts (`backend`: see models.loading.load_model; auto: --backend, then
    models.backends.choose_backend); the dtype is checked first, so a bad value fails before any
    download or conversion."""
    resolve_dtype(args.dtype, args.device)
    if backend == "auto":
        requested = getattr(args, "model_backend", "auto")
        backend = choose_backend(requested, args.target, args.device, _method_on_ggml(args))
    print(f"loading {args.target}" + (f" + {draft}" if draft else "") + " ...", file=sys.stderr)
    return load_models(args.target, draft, args.dtype, args.device, args.max_length, batch, backend)


def int_list(text: str) -> tuple[int, ...]:
    """ "1,2,3" → (1, 2, 3)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"expected comma-separated integers, got {text!r}") from None


def dataclass_defaults(cls) -> dict:
    """A config dataclass's field defaults, so a command's flags default to what the dataclass
    says (one place sets them)."""
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


def add_answer_generation_flags(parser: argparse.ArgumentParser) -> None:
    """How the drafter trainers have the target answer their training prompts."""
    parser.add_argument("--gen-batch-size", type=int, default=16, help="prompts decoded together")
    parser.add_argument(
        "--gen-backend",
        choices=("auto", "torch", "ggml"),
        default="auto",
        help="where the target answers: ggml (llama.cpp over its GGUF as stored, loaded beside "
        "the torch copy that computes the features) or torch; auto: torch where --dtype is "
        "bf16 (by default where the CPU computes bf16 natively; at batch 48 on an "
        "AVX-512-bf16 EPYC it answered 65 tok/s, ggml 51), else ggml for a GGUF target where "
        "llama-cpp-python is installed",
    )
    parser.add_argument(
        "--gen-max-new-tokens", type=int, default=384, help="longest answer generated"
    )
    parser.add_argument(
        "--gen-temperature",
        type=float,
        default=0.0,
        help="sample the target's answers at this temperature (0: greedy); each prompt has its "
        "own seed, so a resumed run samples the same answers",
    )


def answering_model(args: argparse.Namespace):
    """The copy of --target that answers the training prompts on --gen-backend (None: the torch
    target the trainer loaded answers them)."""
    if args.gen_backend == "auto" and resolve_dtype(args.dtype) == torch.bfloat16:
        return None  # the bf16 torch target answers fastest (the flag's help)
    if choose_backend(args.gen_backend, args.target, "cpu", True) != "ggml":
        return None
    return load_models(
        args.target, None, max_length=args.max_length, batch_size=args.gen_batch_size,
        backend="ggml",
    ).target  # fmt: skip


def answers_in(folder: str, flag: str, remedy: str) -> list[Sample]:
    """The target's answers in `folder` (a responses folder, or a train-eagle/train-ppow --out
    holding one in data/), given with `flag`; one error naming `remedy` where there are none."""
    path = Path(folder)
    if not (path / RESPONSES_FILE).is_file() and (path / "data" / RESPONSES_FILE).is_file():
        path = path / "data"
    samples = read_samples(path)
    if not samples:
        raise ConfigError(
            f"{flag} {folder}: no answers ({RESPONSES_FILE}) in it: pass a train-eagle or "
            f"train-ppow --out folder, or {remedy}"
        )
    return samples


def feature_cache_of(args: argparse.Namespace, runner, feature_layers) -> FeatureCache | None:
    """The target's FeatureCache in --feature-cache (None without the flag)."""
    if args.feature_cache is None:
        return None
    return FeatureCache(args.feature_cache, runner, feature_layers)


def add_feature_cache_flag(parser: argparse.ArgumentParser) -> None:
    """Where the head trainers keep the target's teacher-forced features (training.eagle.
    feature_cache): one flag for train-eagle and train-ppow."""
    parser.add_argument(
        "--feature-cache",
        metavar="DIR",
        help="keep the target's features of each training sequence in DIR after its first "
        "prefill and reuse them in later epochs, evaluations and ADAW passes (the same numbers; "
        "pays where the CPU has no native bf16 and the prefill is most of an update). Where the "
        "torch target answers the training prompts itself, it keeps each answer's features as "
        "it writes it, so training prefills none of them (batched decoding's numbers: equal up "
        "to rounding). Disk: (taps + 1) x hidden size x the target's dtype bytes per position "
        "(9.2 KB for SmolLM2-135M in float32, 12 KB for the 1.5B in bf16); train-ppow also "
        "keeps each sequence's KV cache there for its rollouts (2 x layers x KV heads x head "
        "size x dtype bytes per position, 46 KB for SmolLM2-135M in float32). Runs of one "
        "target may share DIR",
    )
