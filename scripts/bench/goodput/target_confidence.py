"""Does the target's own confidence forecast the draft's acceptance? (BENCHMARKS-2026-11 §10.26.)

For each prompt of a batch bench's run log, the target is teacher-forced on plain decoding's
answer (the `ar` run) and its top probability taken at every answer position; constant k = 1's
steps (the `sd:k=1` run) say whether the token drafted at each position was accepted. Printed:
per request the mean confidence (first 8 positions, whole answer) against k = 1's acceptance, and
per step the acceptance by the mean confidence of the 4 positions before the drafted one.

    python scripts/bench/goodput/target_confidence.py RUNS.jsonl[.gz] PROMPTS.jsonl LIMIT
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys

import numpy as np

from specpilot.api import load_models
from specpilot.models.chat import encode_prompt
from specpilot.prompts import read_prompts_file

BINS = [(0.0, 0.5), (0.5, 0.7), (0.7, 0.85), (0.85, 0.95), (0.95, 1.01)]


def main(runs_path: str, prompts_path: str, limit: int) -> None:
    opener = gzip.open if runs_path.endswith(".gz") else open
    with opener(runs_path, "rt") as f:
        batches = [json.loads(line) for line in f][1:]  # the first line is the run's key
    records = read_prompts_file(prompts_path)[:limit]
    target = load_models("qwen2.5-coder-1.5b-instruct", None, "bfloat16").target
    per_request, per_step = [], []
    for batch in batches:
        for j, i in enumerate(batch["batch"]):
            answer = batch["runs"]["ar"][j][0][0]["ids"]
            prompt = encode_prompt(
                target.tokenizer, [{"role": "user", "content": records[i].turns[0]}]
            )
            target.runner.reset()
            logits = target.runner.forward(prompt + answer, logits="all").float()
            start = len(prompt) - 1  # the position that predicts the answer's first token
            top = logits[start : start + len(answer)].softmax(-1).amax(-1).tolist()
            position, outcomes = 0, []
            for step in batch["runs"]["sd:k=1"][j][0][0]["stats"]["records"]:
                if step["num_drafted"]:
                    outcomes.append((position, step["num_accepted"] > 0))
                position += step["num_emitted"]
            outcomes = outcomes[1:]  # the answer's first token is learned apart (Openings)
            rate = sum(accepted for _, accepted in outcomes) / len(outcomes)
            per_request.append((statistics.mean(top[:8]), statistics.mean(top), rate))
            print(f"prompt {i}: confidence first 8 {per_request[-1][0]:.3f}, "
                  f"answer {per_request[-1][1]:.3f}; k = 1 acceptance {rate:.2f}")  # fmt: skip
            per_step += [
                (statistics.mean(top[max(0, p - 4) : p]), accepted)
                for p, accepted in outcomes
                if p >= 1
            ]
    steps = np.array(per_step, dtype=float)
    for low, high in BINS:
        chosen = (steps[:, 0] >= low) & (steps[:, 0] < high)
        rate = steps[chosen, 1].mean() if chosen.any() else float("nan")
        print(f"confidence of the 4 positions before in [{low}, {high}): {chosen.sum()} steps, "
              f"first position accepted {rate:.2f}")  # fmt: skip
    requests = np.array(per_request)
    for column, name in ((0, "first 8 positions"), (1, "whole answer")):
        r = np.corrcoef(requests[:, column], requests[:, 2])[0, 1]
        print(f"per request, correlation of mean confidence ({name}) with acceptance: {r:.2f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
