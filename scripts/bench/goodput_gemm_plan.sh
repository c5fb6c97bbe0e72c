#!/usr/bin/env bash
# BENCHMARKS-2026-11 §10: issue 18's controller with the measured GEMM plan, on whatever CPU runs it
# (there: an AVX2-only AMD EPYC, so --dtype auto is float32). Batch 1 (6 held-out prompts) and
# batch 16 (16), plain decoding, constant k = 1, 2, 3 and the goodput controller, greedy, 48
# tokens, 3 repeats; then the target's latency curve without and with the plan. Resumable
# (same CPU model). Then:
#   python scripts/bench/batch_table.py $OUT/greedy_b1.json $OUT/greedy_b16.json
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/goodput18h}
mkdir -p "$OUT"
METHODS=(--method sd:k=1 --method sd:k=2 --method sd:k=3 --method sd:policy=goodput)
for spec in "1 6" "16 16"; do
  read -r B N <<< "$spec"
  specpilot bench --prompts docs/bench/heldout_alpaca_32.jsonl --limit "$N" --max-new-tokens 48 \
    --repeats 3 --batch-size "$B" --quiet "${METHODS[@]}" \
    --json-out "$OUT/greedy_b$B.json" > "$OUT/greedy_b$B.txt" 2>&1
done
for plan in 0 1; do
  SPECPILOT_GEMM_PLAN=$plan specpilot profile --target qwen2.5-coder-1.5b-instruct --dtype float32 \
    --no-draft --contexts 128 --max-verify 48 --repeats 3 --quiet \
    --out "$OUT/profile_$([ $plan = 0 ] && echo noplan || echo plan).json"
done
