#!/usr/bin/env bash
# Issue 14's done bench: the 24 held-out prompts (8 MT-Bench first turns, 8 HumanEval, 8 GSM8K-test),
# 128 tokens, greedy, the default dtype (bf16 where the CPU has it), 3 repeats, on the default pair
# (1.5B target; 0.5B draft for sd:k=2): plain decoding, sd:k=2, n-gram, the DVI tree, the eagle
# chain, the eagle tree (the default 3 levels x top 4 x 8 nodes, spelled out so that a resumed run
# measures the same tree), the tree with the prompt-lookup branch, and the tree with SVIP.
# Resumable: re-running it on the same CPU model measures only the prompts not yet in its run log
# (the categories take turns, so a part-way run holds each alike). Tables:
#   python scripts/eagle/bench_table.py $OUT/qwen_heldout.json
# DVI_ADAPTER is the DVI row's adapter; the one measured is no longer in the tree:
#   git checkout d5c3d13 -- docs/dvi/adapters/qwen2.5-coder-1.5b-k2-full-u8
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/bench14_done}
mkdir -p "$OUT"
DVI_ADAPTER=${DVI_ADAPTER:-docs/dvi/adapters/qwen2.5-coder-1.5b-k2-full-u8}
V=draft_vocab=16384,draft_vocab_corpus=../shared/data/sharegpt_sample.jsonl
specpilot bench --prompts docs/eagle/heldout_24.jsonl --max-turns 1 --max-new-tokens 128 --repeats 3 \
  --quiet \
  --method sd:k=2 \
  --method sd:drafter=ngram \
  --method sd:drafter=dvi,dvi_adapter=$DVI_ADAPTER,k=1,branches=8,$V \
  --method sd:drafter=eagle,tree_topk=1,tree_depth=4,policy=constant \
  --method sd:drafter=eagle,tree_depth=3,tree_topk=4,tree_nodes=8,policy=constant \
  --method sd:drafter=eagle,tree_depth=3,tree_topk=4,tree_nodes=8,eagle_lookup=7,policy=constant \
  --method sd:drafter=eagle,tree_depth=3,tree_topk=4,tree_nodes=8,policy=svip \
  --json-out "$OUT/qwen_heldout.json"
