#!/usr/bin/env bash
# Issue 18's batch-1 check on a second latency curve: the default pair in float32 (a forward over
# 8 tokens costs far more than one, unlike bf16), plain decoding, constant k = 1, 2, 3 and the
# goodput controller, greedy, 4 held-out AlpacaEval prompts, 48 tokens, 2 repeats (float32 runs
# ~2x slower than bf16 here). Resumable. Then:
#   python docs/bench/batch_table.py $OUT/float32_b1.json
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/work/runs/goodput18}
mkdir -p "$OUT"
specpilot bench --prompts docs/bench/heldout_alpaca_32.jsonl --limit 4 --max-new-tokens 48 \
  --repeats 2 --dtype float32 --quiet \
  --method sd:k=1 --method sd:k=2 --method sd:k=3 --method sd:policy=goodput \
  --json-out "$OUT/float32_b1.json" > "$OUT/float32_b1.txt" 2>&1
