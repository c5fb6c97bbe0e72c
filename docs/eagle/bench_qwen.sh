#!/usr/bin/env bash
# Issue 14's held-out bench on the default pair (1.5B target, 0.5B draft for sd:k=2) with the
# committed 1.5B eagle head. Resumable: re-running it measures only what is missing (same CPU model).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/work/runs/bench14}
mkdir -p "$OUT"
V=draft_vocab=16384,draft_vocab_corpus=../shared/data/sharegpt_sample.jsonl
specpilot bench --prompts docs/eagle/heldout_24.jsonl --max-turns 1 --max-new-tokens 128 --repeats 3 \
  --quiet \
  --method sd:k=2 \
  --method sd:drafter=ngram \
  --method sd:drafter=dvi,adapter=docs/dvi/adapters/qwen2.5-coder-1.5b-k2-full-u8,k=1,branches=8,$V \
  --method sd:drafter=eagle,topk=1,depth=4 \
  --method sd:drafter=eagle \
  --method sd:drafter=eagle,policy=svip \
  --json-out "$OUT/qwen_heldout.json"
