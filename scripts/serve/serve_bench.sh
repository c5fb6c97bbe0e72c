#!/usr/bin/env bash
# bench-serve on SmolLM2: plain decoding vs speculative backends, same load, one at a time.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/serve}
mkdir -p "$OUT"
PROMPTS=docs/eagle/heldout_24.jsonl
run() {  # name, serve flags...
  name=$1; shift
  specpilot serve --target smollm2-135m-instruct --max-batch 64 --max-length 1024 --port 8123 "$@" > $OUT/$name.server.log 2>&1 &
  pid=$!
  for i in $(seq 120); do curl -sf http://127.0.0.1:8123/health >/dev/null && break; sleep 1; done
  specpilot bench-serve --url http://127.0.0.1:8123 --concurrency 1 --requests 12 --max-tokens 128 --prompts-file $PROMPTS --json-out $OUT/$name.c1.json --plot $OUT/$name.c1.png > $OUT/$name.c1.txt 2>&1
  specpilot bench-serve --url http://127.0.0.1:8123 --concurrency 4,16,64 --requests 64 --max-tokens 128 --prompts-file $PROMPTS --json-out $OUT/$name.json --plot $OUT/$name.png > $OUT/$name.txt 2>&1
  kill $pid; wait $pid 2>/dev/null
}
for spec in "$@"; do
  case $spec in
    ar) run ar --drafter none ;;
    ngram) run ngram --drafter ngram ;;
    eagle) run eagle --drafter eagle --tree-depth 3 --tree-topk 4 --tree-nodes 8 ;;
    ngram-goodput) run ngram-goodput --drafter ngram --policy goodput ;;
  esac
done
