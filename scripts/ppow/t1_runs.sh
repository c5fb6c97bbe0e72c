#!/usr/bin/env bash
# §12's next lever: PPOW, its no-ADAW ablation and the distillation baseline on prefixes the
# target *sampled* at T = 1, from SmolLM2's committed head. The answers (499 prompts, float32,
# each prompt with its own seed) are docs/ppow/data/smol_t1_answers.jsonl.gz; all three runs
# share one --feature-cache folder (the target's taps, last hidden states and, for PPOW's
# rollouts, KV caches: ~5 GB). Resumable: re-run it after an interruption. One thread each
# (two runs side by side on two cores); OUT (default runs/ppow_t1, from the repository root) holds
# ppow/, distill/, no-adaw/ and features/.
set -eu
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/ppow_t1}
FC="$OUT/features"
mkdir -p "$OUT/ppow/data"
[ -s "$OUT/ppow/data/responses.jsonl" ] ||
  gunzip -c docs/ppow/data/smol_t1_answers.jsonl.gz > "$OUT/ppow/data/responses.jsonl"
common=(--target smollm2-135m-instruct --gen-temperature 1 --data-dir ../shared/data
  --feature-cache "$FC")
export OMP_NUM_THREADS=1
specpilot train-ppow "${common[@]}" --out "$OUT/ppow" --no-proximity &
specpilot train-ppow "${common[@]}" --out "$OUT/distill" --baseline distill --responses "$OUT/ppow"
specpilot train-ppow "${common[@]}" --out "$OUT/no-adaw" --no-adaw --no-proximity \
  --responses "$OUT/ppow"
wait
