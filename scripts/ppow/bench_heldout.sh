#!/usr/bin/env bash
# Issue 17's held-out bench: the eagle head PPOW started from (the committed one, or INIT) against
# the heads trained from it for the same updates on the same samples: continued distillation
# (--baseline distill), PPOW, PPOW without ADAW and PPOW without the proximity reward, each
# drafting the EAGLE-2 default tree, against plain decoding. 24 held-out prompts (8 MT-Bench
# first turns, 8 HumanEval, 8 GSM8K-test), 128 tokens, greedy and T = 1.
# RUNS: folder holding the train-ppow --out folders distill, ppow, no-adaw, no-prox (each with
# head/; NAMES lists them, default "distill ppow no-adaw no-prox"; a run without a head is left out);
# INIT: the head folder the runs started from (--init; default the target's committed head);
# TARGET (default smollm2-135m-instruct); REPEATS (default 3); LIMIT (prompts per
# category, default all 8); TEMPS (default "0 1"). Reports: $OUT/heldout_t{0,1}.json.
# Resumable: re-running it measures only what is missing (same CPU model and REPEATS: a report
# is keyed on its configuration, so more repeats need another OUT).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/ppow_bench}
RUNS=${RUNS:?set RUNS to the folder of the train-ppow runs}
mkdir -p "$OUT"
HEADS=()
for run in ${NAMES:-distill ppow no-adaw no-prox}; do
  if [ -d "$RUNS/$run/head" ]; then
    HEADS+=(--method "sd:drafter=eagle,eagle_head=$RUNS/$run/head,policy=constant")
  else
    echo "no head in $RUNS/$run: left out" >&2
  fi
done
for T in ${TEMPS:-0 1}; do
  specpilot bench --target "${TARGET:-smollm2-135m-instruct}" \
    --prompts docs/eagle/heldout_24.jsonl --max-turns 1 --max-new-tokens 128 \
    --repeats "${REPEATS:-3}" ${LIMIT:+--limit "$LIMIT"} --draft none --quiet \
    --temperature "$T" \
    --method "sd:drafter=eagle,policy=constant${INIT:+,eagle_head=$INIT}" "${HEADS[@]}" \
    --json-out "$OUT/heldout_t$T.json"
done
