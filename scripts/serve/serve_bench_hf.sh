#!/usr/bin/env bash
# The transformers-generate baseline server under the same load (levels bounded at 120 s).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/serve}
mkdir -p "$OUT"
PROMPTS=docs/eagle/heldout_24.jsonl
specpilot serve --backend hf-generate --target smollm2-135m-instruct --max-length 1024 --port 8125 > $OUT/hf.server.log 2>&1 &
pid=$!
for i in $(seq 120); do curl -sf http://127.0.0.1:8125/health >/dev/null && break; sleep 1; done
specpilot bench-serve --url http://127.0.0.1:8125 --concurrency 1 --requests 12 --max-tokens 128 --prompts-file $PROMPTS --json-out $OUT/hf.c1.json --plot $OUT/hf.c1.png > $OUT/hf.c1.txt 2>&1
specpilot bench-serve --url http://127.0.0.1:8125 --concurrency 4,16,64 --requests 64 --max-tokens 128 --timeout-s 120 --prompts-file $PROMPTS --json-out $OUT/hf.json --plot $OUT/hf.png > $OUT/hf.txt 2>&1
kill $pid; wait $pid 2>/dev/null
