"""Held-out acceptance of eagle heads per prompt category, teacher-forced (no decoding loop).

The target answers the held-out prompts once (greedy, batched plain decoding; kept in
OUT/responses.jsonl, which `train-eagle --valid-responses OUT` then scores every head on), then
each head is scored on those answers as the trainer's validation scores it: first-token agreement
and the chain accepted length of its unrolled steps, per category and over all answers. With
heads trained on more and more answers this is the acceptance-vs-data curve.

    python scripts/eagle/accept_by_category.py --out runs/accept14 \
        --head untrained --head runs/eagle-qwen15/head --head default
    python scripts/eagle/accept_by_category.py --prompts docs/eagle/heldout_24.jsonl \
        --prompts docs/bench/heldout_alpaca_32.jsonl --out docs/eagle/data/qwen15_heldout \
        --head default
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from specpilot.api import load_models
from specpilot.config import GenerationConfig
from specpilot.drafting.eagle_head import EagleHead, EagleShape, resolve_head
from specpilot.engine.speculative import SpeculativeEngine
from specpilot.models.chat import encode_prompt, eos_token_ids
from specpilot.training.eagle.data import RESPONSES_FILE, Sample
from specpilot.training.eagle.feature_cache import FeatureCache
from specpilot.training.eagle.trainer import EagleTrainConfig, evaluate

BATCH = 24
"""Prompts answered together."""


def answers(target, prompts: list[dict], path: Path, max_new_tokens: int) -> list[Sample]:
    """The target's greedy answers to `prompts` (cached in `path`)."""
    if path.is_file():
        return [Sample(**row) for row in map(json.loads, path.read_text().splitlines())]
    engine = SpeculativeEngine(
        target.runner, target.tokenizer, eos_ids=eos_token_ids(target.tokenizer, target.path)
    )
    ids = [encode_prompt(target.tokenizer, p["turns"][0]) for p in prompts]
    results = []
    for start in range(0, len(ids), BATCH):
        config = GenerationConfig(max_new_tokens=max_new_tokens)
        results += engine.generate_batch(ids[start : start + BATCH], config)
    samples = [
        Sample(f"{p['category']}/{p['question_id']}", prompt_ids, result.token_ids)
        for p, prompt_ids, result in zip(prompts, ids, results, strict=True)
    ]
    path.write_text("".join(json.dumps(vars(s)) + "\n" for s in samples))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument(
        "--prompts", action="append", help="held-out prompt files (default: heldout_24.jsonl)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--head", action="append", required=True,
        help="a head folder, 'default' (the committed head) or 'untrained' (the committed head's "
        "shape and draft vocabulary, initialised from the target's top layer as training starts)",
    )  # fmt: skip
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = load_models(args.target, None, "auto", batch_size=BATCH).target
    prompts = [
        json.loads(line)
        for path in args.prompts or ["docs/eagle/heldout_24.jsonl"]
        for line in Path(path).read_text().splitlines()
    ]
    samples = answers(target, prompts, out / RESPONSES_FILE, args.max_new_tokens)
    by_category = defaultdict(list)
    for sample in samples:
        by_category[sample.id.split("/")[0]].append(sample)
    expected = EagleShape.for_target(target.runner, target.tokenizer)
    committed = EagleHead.load(resolve_head(None, target.name), expected=expected)
    config = EagleTrainConfig()
    caches = {}  # the answers' features, prefilled once for every head and category
    rows = []
    for name in args.head:
        if name == "untrained":
            head = EagleHead(committed.shape, committed.draft_ids)
            head.init_from_target(target.runner)
        else:
            head = EagleHead.load(resolve_head(None if name == "default" else name, target.name),
                                  expected=expected)  # fmt: skip
        target_rows = target.runner.lm_head[head.draft_ids].contiguous()
        layers = head.shape.feature_layers
        if layers not in caches:
            caches[layers] = FeatureCache.for_held_out(None, target.runner, layers)
        for category, group in [*sorted(by_category.items()), ("all", samples)]:
            scores = evaluate(
                head, target.runner, group, head.shape, config, target_rows, caches[layers]
            )
            rows.append({"head": name, "category": category} | scores)
            print(json.dumps(rows[-1]), flush=True)
    (out / "accept_by_category.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
