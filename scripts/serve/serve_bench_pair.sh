#!/usr/bin/env bash
# bench-serve on the default pair (Qwen2.5-Coder 1.5B target, 0.5B draft): plain decoding, speculative
# decoding (sd:k=2, the 0.5B draft) and transformers' generate (plain and assisted by the same draft),
# one server at a time, same load. 64 tokens per request to fit a session; levels bounded at 300 s (hf-generate, one request at a time: 120 s).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/serve_pair}
PROMPTS=docs/eagle/heldout_24.jsonl
TARGET=qwen2.5-coder-1.5b-instruct
DRAFT=qwen2.5-coder-0.5b-instruct
PORT=8131
LEVEL_S=300
load() {  # name
  name=$1
  specpilot bench-serve --url http://127.0.0.1:$PORT --concurrency 1 --requests 6 --max-tokens 64 --timeout-s 300 --prompts-file $PROMPTS --json-out $OUT/$name.c1.json > $OUT/$name.c1.txt 2>&1
  specpilot bench-serve --url http://127.0.0.1:$PORT --concurrency 4,16,64 --requests 64 --max-tokens 64 --timeout-s "$LEVEL_S" --prompts-file $PROMPTS --json-out $OUT/$name.json --plot $OUT/$name.png > $OUT/$name.txt 2>&1
}
run() {  # name, serve flags...
  name=$1; shift
  specpilot serve --target $TARGET --max-length 1024 --port $PORT "$@" > $OUT/$name.server.log 2>&1 &
  pid=$!
  for i in $(seq 300); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break; sleep 1; done
  load $name
  kill $pid; wait $pid 2>/dev/null
}
for spec in "$@"; do
  case $spec in
    ar) run ar --max-batch 64 --drafter none ;;
    sd) run sd --max-batch 64 --drafter model --draft $DRAFT --k 2 ;;
    sd-goodput) run sd-goodput --max-batch 64 --drafter model --draft $DRAFT --policy goodput ;;
    hf) LEVEL_S=120 run hf --backend hf-generate ;;
    hf-assisted) LEVEL_S=120 run hf-assisted --backend hf-generate --draft $DRAFT ;;
  esac
done
