"""Prefill per turn of MT-Bench conversations (BENCHMARKS-2026-11 §7): SmolLM2-135M, n-gram drafter.

Usage: python scripts/bench/prefill_reuse.py QUESTIONS DTYPE > out.json
Each conversation starts from an empty cache (as in `specpilot bench`); prints, per conversation
and turn, the prompt length, the tokens the prefill fed, prefill seconds and the answer's ids.
"""

import json
import sys

from specpilot.api import build_engine, load_models
from specpilot.config import GenerationConfig
from specpilot.models.chat import encode_prompt
from specpilot.prompts import read_prompts_file

questions, dtype = int(sys.argv[1]), sys.argv[2]
records = read_prompts_file("../shared/data/mt_bench_question.jsonl")[:questions]
models = load_models("smollm2-135m-instruct", None, dtype=dtype)
engine = build_engine(models, "ngram", "constant", k=3)
tokenizer = models.target.tokenizer
engine.generate(records[0].turns[0], GenerationConfig(max_new_tokens=8))  # warm-up
cold_start = getattr(engine, "clear_cache", models.target.runner.reset)  # before: reset per turn
rows = []
for record in records:
    cold_start()
    messages, turns = [], []
    for turn in record.turns:
        messages.append({"role": "user", "content": turn})
        result = engine.generate(messages, GenerationConfig(max_new_tokens=128))
        stats = result.stats
        fed = getattr(stats, "prefill_tokens", None)
        prompt = len(encode_prompt(tokenizer, messages))
        turns.append(
            {
                "prompt": prompt,
                "fed": fed,
                "prefill_s": stats.prefill_s,
                "token_ids": result.token_ids,
            }
        )
        messages.append({"role": "assistant", "content": result.text})
    rows.append(turns)
print(json.dumps(rows))
