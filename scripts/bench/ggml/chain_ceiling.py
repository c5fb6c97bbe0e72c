"""Draft-length ceilings of a draft model's chains (issue 64: SVIP, SV, the goodput controller).

Under greedy decoding what a chain accepts is fixed by the target's greedy answer: at answer
position t the draft's chain of k tokens keeps min(run[t], k) of them, run[t] being how many
consecutive answer tokens from t the draft predicts when fed the true prefix (one teacher-forced
draft forward per answer; a chain agrees with the target exactly as long as its context is the
true prefix). With a cost model from `specpilot profile` (the target's verify curve T(n) and the
draft's one-token step d), each cycle choice costs, in ms:

- draft length k ≥ 1 (constant k, SVIP): k·d + T(k + 1), emitting min(run, k) + 1 tokens;
- k = 0 (the goodput controller may draft nothing): T(1), emitting 1;
- SV at batch 1: draft γ = SV_GAMMA_MAX, verify n = 0..γ of them: γ·d + T(n + 1).

Printed and written (--out): plain decoding, every constant k, and the hindsight ceilings
(bench.hindsight) of choosing k in 1..K (SVIP's choice), in 0..K (the controller's) and n in
0..γ after drafting γ (SV's), as replay tokens/s over the same answers. Greedy only: under
sampling acceptance is random, so these ceilings do not carry over.

    python scripts/bench/ggml/chain_ceiling.py --prompts FILE --profile PROFILE.json \
        [--limit N] [--max-new-tokens N] [--max-k 8] --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from specpilot.api import load_models
from specpilot.bench.hindsight import hindsight_rate
from specpilot.config import GenerationConfig
from specpilot.engine import SpeculativeEngine
from specpilot.methods.defaults import DEFAULT_DRAFT, DEFAULT_TARGET, SV_GAMMA_MAX
from specpilot.models.chat import encode_prompt, eos_token_ids
from specpilot.policies.latency import interpolate, read_verify_curves
from specpilot.prompts import read_prompts_file


def runs_of(matches: np.ndarray) -> np.ndarray:
    """run[t]: how many consecutive True values start at t."""
    run = np.zeros(len(matches) + 1, dtype=np.int64)
    for t in range(len(matches) - 1, -1, -1):
        run[t] = run[t + 1] + 1 if matches[t] else 0
    return run[:-1]


def answer_runs(models, records, max_new_tokens: int) -> list[np.ndarray]:
    """Per prompt, run[t] of the draft against the target's greedy answer."""
    target, draft = models.target, models.draft
    eos = eos_token_ids(target.tokenizer, target.path)
    engine = SpeculativeEngine(target.runner, target.tokenizer, eos_ids=eos)
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    runs = []
    for record in records:
        prompt = encode_prompt(target.tokenizer, record.turns[0])
        answer = engine.generate(prompt, config).token_ids
        draft.runner.reset()
        logits = draft.runner.run_batch([prompt + answer[:-1]], [0], logits="all")[0].logits
        predicted = logits[len(prompt) - 1 :].argmax(dim=-1).numpy()
        runs.append(runs_of(predicted == np.array(answer)))
        mean = runs[-1].mean()
        print(f"{record.question_id}: {len(answer)} tokens, mean run {mean:.2f}", file=sys.stderr)
    return runs


def rate_of(tokens: np.ndarray, ms: np.ndarray, answer: np.ndarray) -> float:
    return 1000 * hindsight_rate(tokens, ms, answer)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--profile", required=True, help="`specpilot profile --out` JSON")
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    profile = json.loads(Path(args.profile).read_text())
    curves = read_verify_curves(args.profile)
    curve = list(enumerate(curves[min(curves)], start=1))
    verify = [0.0] + [interpolate(curve, n) for n in range(1, args.max_k + 2)]
    draft_ms = float(profile["draft_step_ms"])
    models = load_models(args.target, args.draft, max_length=4096, backend="ggml")
    records = read_prompts_file(args.prompts)[: args.limit]
    runs = answer_runs(models, records, args.max_new_tokens)
    run = np.concatenate(runs)
    answer = np.concatenate([np.full(len(r), i) for i, r in enumerate(runs)])

    ks = np.arange(args.max_k + 1)
    tokens = np.minimum(run[:, None], ks[None, :]) + 1  # [position, k]
    ms = np.broadcast_to(ks * draft_ms + np.array(verify[1:]), tokens.shape)
    gamma = SV_GAMMA_MAX
    sv_ms = gamma * draft_ms + np.array(verify[1 : gamma + 2])
    sv_ms = np.broadcast_to(sv_ms, (len(run), gamma + 1))
    rows = {"plain": rate_of(tokens[:, :1], ms[:, :1], answer)}
    for k in range(1, args.max_k + 1):
        rows[f"constant k={k}"] = rate_of(tokens[:, k : k + 1], ms[:, k : k + 1], answer)
    rows["ceiling k in 1..K (SVIP)"] = rate_of(tokens[:, 1:], ms[:, 1:], answer)
    rows["ceiling k in 0..K (controller)"] = rate_of(tokens, ms, answer)
    rows[f"ceiling n in 0..{gamma} after {gamma} (SV)"] = rate_of(
        tokens[:, : gamma + 1], sv_ms, answer
    )
    best = max(v for k, v in rows.items() if k.startswith("constant"))
    for name, value in rows.items():
        print(f"{name:34} {value:7.2f} tok/s  {value / rows['plain']:5.3f}× plain  "
              f"{value / best:5.3f}× best constant")  # fmt: skip
    result = {
        "target": args.target,
        "draft": args.draft,
        "prompts": args.prompts,
        "answers": len(runs),
        "positions": int(len(run)),
        "mean_run": float(run.mean()),
        "profile": args.profile,
        "verify_ms": verify[1:],
        "draft_step_ms": draft_ms,
        "tokens_per_s": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
