"""How fast the target answers training prompts for train-eagle, per backend.

Answers the same training prompts (round-robin order, after --skip) with each backend at
--batch-size, as train-eagle does (`generate_responses`: static batches of --batch-size
prompts), and prints answered tokens per second of wall time. One process, one run each, in
the order given:

    python scripts/eagle/answer_rate.py --backend torch --backend ggml --batch-size 48 \
        --prompts 96 --skip 2028 --max-new-tokens 256 --out runs/answer_rate.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from specpilot.api import load_models
from specpilot.engine import SpeculativeEngine
from specpilot.models.chat import eos_token_ids
from specpilot.models.cpu import cpu_info
from specpilot.training.eagle.data import DataOptions, generate_responses

TARGET = "qwen2.5-coder-1.5b-instruct"


def answer_rate(engine: SpeculativeEngine, options: DataOptions) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        samples = generate_responses(engine, options, folder, progress=False)
        seconds = time.perf_counter() - start
    return _rate(len(samples), sum(len(s.response_ids) for s in samples), seconds)


def _rate(answers: int, tokens: int, seconds: float) -> dict:
    return {
        "answers": answers,
        "tokens": tokens,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(tokens / seconds, 2),
        "answers_per_hour": round(answers / seconds * 3600),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", choices=("torch", "ggml"), required=True)
    parser.add_argument("--batch-size", type=int, default=48)
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--skip", type=int, default=2028)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--out")
    args = parser.parse_args()
    options = DataOptions(
        data_dir=args.data_dir,
        max_prompts=args.prompts,
        skip=args.skip,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
    )
    report = {"cpu": cpu_info()[0], "target": TARGET, "config": vars(args), "runs": []}
    for backend in args.backend:
        target = load_models(
            TARGET, None, max_length=1024, batch_size=args.batch_size, backend=backend
        ).target
        engine = SpeculativeEngine(
            target.runner, target.tokenizer, eos_ids=eos_token_ids(target.tokenizer, target.path)
        )
        row = {"backend": backend, **answer_rate(engine, options)}
        report["runs"].append(row)
        print(json.dumps(row), flush=True)
        del engine, target
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
