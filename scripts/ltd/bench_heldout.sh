#!/usr/bin/env bash
# Issue 16's held-out bench on a target with its committed eagle head (default: the 1.5B): the
# best static tree of train-ltd's grid (on W = 8 trees, from the run's summary.json), the EAGLE-2
# default tree, SVIP on the tree, and LTD size-only, depth-only and both, against plain decoding.
# 24 held-out prompts (8 MT-Bench first turns, 8 HumanEval, 8 GSM8K-test), 128 tokens, greedy.
# STATIC="tree_depth=D,tree_nodes=V" (the best static of summary.json), POLICIES (default: the committed
# ones of TARGET), OTHER (policy folders also run as LTD both, e.g. another target's: the
# cross-target test), REPEATS (default 3), LIMIT (prompts per category, default all 8),
# TARGET (default qwen2.5-coder-1.5b-instruct), REPORT (default qwen_heldout), TOPK (the static
# tree's width, default 8: the policies' W), BACKEND (default auto: ggml for the GGUF target).
# Resumable: re-running it measures only what is missing (same CPU model).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/ltd_bench}
mkdir -p "$OUT"
P=${POLICIES:+,ltd_policies=$POLICIES}
LTD=sd:drafter=eagle,policy=ltd$P
EXTRA=()
for folder in ${OTHER:-}; do EXTRA+=(--method "sd:drafter=eagle,policy=ltd,ltd_policies=$folder"); done
specpilot bench --target "${TARGET:-qwen2.5-coder-1.5b-instruct}" \
  --prompts docs/eagle/heldout_24.jsonl --max-turns 1 --max-new-tokens 128 \
  --repeats "${REPEATS:-3}" ${LIMIT:+--limit "$LIMIT"} --draft none --quiet \
  --backend "${BACKEND:-auto}" \
  --method "sd:drafter=eagle,tree_topk=${TOPK:-8},$STATIC,policy=constant" \
  --method sd:drafter=eagle,policy=constant \
  --method sd:drafter=eagle,policy=svip \
  --method "$LTD,use=size" \
  --method "$LTD,use=depth" \
  --method "$LTD" \
  "${EXTRA[@]}" \
  --json-out "$OUT/${REPORT:-qwen_heldout}.json"
