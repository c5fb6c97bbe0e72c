"""Are a ggml bench run's greedy divergences near-ties? For every prompt where a method's greedy
output left plain decoding's (the report's `divergences`), decode the prompt again on the ggml
backend, one token a step (batch 1), and report at the divergence position: the gap between the
target's two best logits, where that gap ranks among the gaps of every position decoded, and how
far that position's logits move when the same prefix is fed as one multi-token forward (as a
verification feeds it). A gap no larger than that movement is a tie the kernels' rounding decides;
the float32 tests prove the algorithm exact (tests/lossless).

    python scripts/bench/ggml/divergence_margins.py REPORT --method METHOD [--out OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from specpilot.bench.run import select_prompts, write_json
from specpilot.models import load_model
from specpilot.models.chat import encode_prompt


def gaps_and_movement(runner, prompt_ids: list[int], position: int) -> dict:
    """Decode `position + 1` tokens a step at a time (the top-2 gap of each step), then feed the
    tokens before `position` as one forward after the prompt: how far the logits predicting
    token `position` move."""
    runner.reset()
    logits = runner.forward(prompt_ids, logits="last")[-1].float()
    tokens, gaps = [], []
    for step in range(position + 1):
        if step == position:
            stepwise = logits
        top = torch.topk(logits, 2).values
        gaps.append(float(top[0] - top[1]))
        tokens.append(int(logits.argmax()))
        logits = runner.forward([tokens[-1]], logits="last")[-1].float()
    runner.reset()
    chunked = runner.forward(prompt_ids, logits="last")[-1].float()
    if position:
        chunked = runner.forward(tokens[:position], logits="last")[-1].float()
    gap = gaps[position]
    return {
        "position": position,
        "gap": round(gap, 4),
        "gap_quantile": round(sum(g <= gap for g in gaps) / len(gaps), 3),
        "median_gap": round(statistics.median(gaps), 4),
        "chunk_movement": round(float((stepwise - chunked).abs().max()), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", help="a `specpilot bench --json-out` report (greedy)")
    parser.add_argument("--method", required=True, help="the method whose divergences to check")
    parser.add_argument("--out", help="JSON file to write")
    args = parser.parse_args()
    report = json.loads(Path(args.report).read_text())
    config = report["config"]
    rows = [r for r in report["results"] if r["method"] == args.method and r["category"] == "all"]
    if not rows:
        raise SystemExit(f"no method {args.method!r} in {args.report}")
    records = {
        r.question_id: r
        for r in select_prompts(
            config["prompts"], config["limit"], config["max_turns"], config["seed"]
        )
    }
    loaded = load_model(config["target"], backend="ggml", progress=False)
    checked = []
    for divergence in rows[0]["divergences"]:
        if divergence["turn"]:
            continue  # later turns depend on the earlier answers; not rebuilt here
        record = records[divergence["question_id"]]
        prompt_ids = encode_prompt(loaded.tokenizer, [{"role": "user", "content": record.turns[0]}])
        result = gaps_and_movement(loaded.runner, prompt_ids, divergence["position"])
        checked.append({"question_id": record.question_id, **result})
        print(json.dumps(checked[-1]))
    summary = {
        "report": args.report,
        "method": args.method,
        "divergences": checked,
        "ties": sum(c["gap"] <= c["chunk_movement"] for c in checked),
    }
    print(f"{summary['ties']} of {len(checked)} divergences are gaps within the chunk movement")
    if args.out:
        write_json(args.out, summary)


if __name__ == "__main__":
    main()
