"""`specpilot generate`: answer prompts with speculative decoding, streaming the text."""

from __future__ import annotations

import argparse
import json
import sys

from specpilot.cli.common import (
    BATCH_HELP,
    add_backend_argument,
    add_method_arguments,
    add_model_arguments,
    batch_size,
    engine_builder,
    generation_config,
    load_from_args,
)
from specpilot.config import GenerationConfig
from specpilot.engine import GenerationStats
from specpilot.errors import ConfigError
from specpilot.prompts import PromptRecord, answer_conversations, read_prompts_file

MAX_NEW_TOKENS_HELP = (
    "at most N new tokens per answer (default %(default)s); an answer ends earlier at the "
    "end-of-sequence token or when the context (--max-length) is full"
)


def register(commands) -> None:
    parser = commands.add_parser("generate", help="generate text with speculative decoding")
    add_model_arguments(parser, GenerationConfig().max_new_tokens, MAX_NEW_TOKENS_HELP)
    add_backend_argument(parser)
    add_method_arguments(parser)
    parser.add_argument("--batch-size", type=int, default=1, help=BATCH_HELP)
    parser.add_argument("--prompt", help="one user message")
    parser.add_argument("--prompts-file", help="JSONL with question_id and turns")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--json", action="store_true", help="one JSON object per prompt on stdout")
    parser.add_argument(
        "--learn", action="store_true", help="--drafter dvi: keep training the head while decoding"
    )
    parser.add_argument("--dvi-save", help="with --learn: save the adapter here at the end")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = generation_config(args, tuple(args.stop))
    size = batch_size(args.batch_size)
    draft, build = engine_builder(args, learn=args.learn)
    if args.prompts_file:
        records = read_prompts_file(args.prompts_file)
    elif args.prompt is not None:
        records = [PromptRecord(0, (args.prompt,))]
    else:
        raise ConfigError("give --prompt TEXT or --prompts-file FILE.jsonl")
    if args.dvi_save and not args.learn:
        raise ConfigError("--dvi-save saves the head that --learn trains: add --learn")
    models = load_from_args(args, draft, size)
    engine = build(models)
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
            print_answer(args, record, results, engine.method, streamed=streamer is not None)
    summary = getattr(engine.drafter, "summary", None)
    learned = None if summary is None else summary()
    if learned:
        print(f"[{learned}]", file=sys.stderr)
    if args.dvi_save:
        engine.drafter.save(args.dvi_save)
        print(f"adapter saved: {args.dvi_save}", file=sys.stderr)
    return 0


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


def print_answer(args, record: PromptRecord, results: list, method: str, streamed: bool) -> None:
    """One conversation's answers: a JSON line (with the `method` that decoded, its drafter and
    policy resolved), or the text (unless streamed) and a summary."""
    stats = GenerationStats.combined([r.stats for r in results])
    if args.json:
        last = results[-1]
        document = {
            "question_id": record.question_id,
            "text": last.text,
            "token_ids": last.token_ids,
            "finish_reason": last.finish_reason,
            "turns": [r.text for r in results],
            "method": method,
            "stats": stats.summary(),
        }
        print(json.dumps(document), flush=True)
        return
    if not streamed:
        for result in results:
            print(result.text)
    print(summary_line(stats), file=sys.stderr)
