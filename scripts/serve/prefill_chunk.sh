#!/usr/bin/env bash
# Chunked prefill (serve --prefill-chunk) against reading every admitted prompt at once: one
# server at a time, SmolLM2-135M decoding plainly (the prefill's effect without a drafter's),
# a closed loop of CONCURRENCY clients (default 8) over REQUESTS requests (default 48), so new
# prompts keep arriving while other requests decode. CHUNKS: the servers, in order ("none" =
# unchunked; default "none 32 none 32": repeated in turns against a drifting host); PROMPTS: a
# JSONL prompt file (default docs/eagle/heldout_24.jsonl).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to a folder for the reports and the server logs}
mkdir -p "$OUT"
PORT=8141
PID=
trap '[ -n "$PID" ] && kill $PID 2>/dev/null' EXIT
run=0
for chunk in ${CHUNKS:-none 32 none 32}; do
  run=$((run + 1))
  flags=()
  [ "$chunk" != none ] && flags=(--prefill-chunk "$chunk")
  specpilot serve --target smollm2-135m-instruct --drafter none --max-length 1024 \
    --max-batch "${CONCURRENCY:-8}" --port $PORT "${flags[@]}" > "$OUT/$run.$chunk.server.log" 2>&1 &
  PID=$!
  for i in $(seq 300); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break; sleep 1; done
  specpilot bench-serve --url http://127.0.0.1:$PORT --concurrency "${CONCURRENCY:-8}" \
    --requests "${REQUESTS:-48}" --max-tokens 64 --timeout-s 1800 \
    --prompts-file "${PROMPTS:-docs/eagle/heldout_24.jsonl}" --json-out "$OUT/$run.$chunk.json" \
    | tee "$OUT/$run.$chunk.txt"
  kill $PID; wait $PID 2>/dev/null; PID=
done
