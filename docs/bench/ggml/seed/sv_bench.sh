#!/bin/bash
# SV on the ggml backend against the best constant k and plain decoding, batch 1, 8, 32 (greedy).
# Reports: docs/bench/ggml/seed/sv_*_epyc.json (BENCHMARKS §0.1). The 0.5B draft and the 1.5B target
# as Q4_K_M GGUFs; the companion's 8-layer GGUF is written into the cache on first use.
set -e
mkdir -p runs/sv_ggml
P=runs/sv_ggml/profile_t0.json
specpilot profile-sv --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct \
  --companion early-exit:target:8 --out $P --quiet
M="--method ar --method sd:drafter=model,k=1,policy=constant --method sd:drafter=model,k=2,policy=constant --method sd:drafter=model,policy=sv,sv_profile=$P"
specpilot bench --backend ggml --prompts docs/eagle/heldout_24.jsonl --limit 2 --max-turns 1 \
  --max-new-tokens 128 --repeats 3 $M --json-out runs/sv_ggml/b1_t0.json
specpilot bench --backend ggml --prompts docs/bench/heldout_alpaca_32.jsonl --limit 16 --max-new-tokens 48 \
  --batch-size 8 --repeats 3 $M --json-out runs/sv_ggml/b8_t0.json
specpilot bench --backend ggml --prompts docs/bench/heldout_alpaca_32.jsonl --limit 32 --max-new-tokens 48 \
  --batch-size 32 --repeats 3 $M --json-out runs/sv_ggml/b32_t0.json
# T = 0.7: a profile recorded at that temperature (SV's table is per decoding rule), batch 1
specpilot profile-sv --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct \
  --companion early-exit:target:8 --temperature 0.7 --latency-profile runs/sv_ggml/profile_t0.json \
  --out runs/sv_ggml/profile_t07.json --quiet
specpilot bench --backend ggml --prompts docs/eagle/heldout_24.jsonl --limit 2 --max-turns 1 \
  --max-new-tokens 128 --repeats 3 --temperature 0.7 --method ar --method sd:drafter=model,k=1,policy=constant \
  --method sd:drafter=model,policy=sv,sv_profile=runs/sv_ggml/profile_t07.json --json-out runs/sv_ggml/b1_t07.json
