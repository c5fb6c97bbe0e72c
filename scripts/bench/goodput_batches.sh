#!/usr/bin/env bash
# Issue 18's batch bench on the default pair (1.5B target, 0.5B draft): plain decoding, constant
# k = 1, 2, 3, SV and the goodput controller at batch 1, 2, 4, 8, 16, 32 (greedy, 48 tokens,
# 3 repeats), then plain, k = 2, SV and the controller at T = 0.7 at batch 1 and 16. Prompts: the
# last 32 AlpacaEval instructions of ../shared/data/alpaca_sample.jsonl (no eagle head or SV table
# trained on them): the first 8 at batch 1 and 2 (a batch-1 run of all six methods costs ~3 min per
# prompt here), 16 at batch 4 to 16, all 32 at batch 32 so that batch is full.
# SV_PROFILE=FILE is SV's table (default: the one profiled in the archived notebook's §4 on another CPU,
# docs/benchmarks/archive/BENCHMARKS-2026-11.md); NO_SV=1
# leaves SV out (its cost does not depend on the controller); K="1 2" sets the constant k's;
# BATCHES="2 4" the greedy batch sizes (default all); NO_T07=1 leaves the T = 0.7 runs out;
# REPEATS=N repeats each batch N times (default 3; many repeats of plain decoding and the controller
# alone, K=" " NO_SV=1, give repeats.py's paired interval, which the host's drift does not widen).
# Resumable: re-running it measures only what is missing (same CPU model and REPEATS: a report is
# keyed on its configuration, so more repeats need another OUT). Then:
#   specpilot plot-batches $OUT/greedy_b{1,2,4,8,16,32}.json
#   python scripts/bench/batch_table.py $OUT/greedy_b{1,2,4,8,16,32}.json
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/goodput18}
mkdir -p "$OUT"
SV=(--method sd:policy=sv,sv_profile=${SV_PROFILE:-docs/bench/sv_profile_ee8.json})
[ -n "${NO_SV:-}" ] && SV=()
bench() {  # name, batch, limit, flags...
  name=$1 batch=$2 limit=$3; shift 3
  specpilot bench --prompts docs/bench/heldout_alpaca_32.jsonl --limit "$limit" --max-new-tokens 48 \
    --repeats "${REPEATS:-3}" --batch-size "$batch" --quiet "$@" \
    --json-out "$OUT/$name.json" > "$OUT/$name.txt" 2>&1
}
GREEDY=()
for k in ${K:-1 2 3}; do GREEDY+=(--method "sd:k=$k"); done
GREEDY+=("${SV[@]}" --method sd:policy=goodput)
for B in ${BATCHES:-1 2 4 8 16 32}; do  # 8 prompts at batch 1 and 2, 16 up to 16, 32 at 32
  bench greedy_b$B "$B" $((B <= 2 ? 8 : B <= 16 ? 16 : 32)) "${GREEDY[@]}"
done
[ -n "${NO_T07:-}" ] && exit 0
for B in 1 16; do
  bench t07_b$B $B $((B == 1 ? 8 : 16)) --method sd:k=2 "${SV[@]}" --method sd:policy=goodput \
    --temperature 0.7
done
