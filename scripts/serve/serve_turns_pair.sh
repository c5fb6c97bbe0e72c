#!/usr/bin/env bash
# The default pair's servers side by side, loaded in turns (bench-serve with several --url): each
# round sends the same request to one server after another, so a host whose speed drifts slows
# them alike, and each server after the first is reported as its median per-round speed ratio to
# the first. NAMES: servers to compare, the first the reference (default "sd sd-goodput"; also ar);
# REQUESTS (default 12), CONCURRENCY (default 1), MAX_BATCH (default 4: each server holds its
# KV cache, and two float32 servers of the pair with 4 slots of 1,024 tokens take ~17 GB).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to a folder for the report and the server logs}
mkdir -p "$OUT"
TARGET=qwen2.5-coder-1.5b-instruct
DRAFT=qwen2.5-coder-0.5b-instruct
PORT=8131
URLS=() PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null' EXIT
for name in ${NAMES:-sd sd-goodput}; do
  case $name in
    ar) flags=(--drafter none) ;;
    sd) flags=(--drafter model --draft $DRAFT --k 2) ;;
    sd-goodput) flags=(--drafter model --draft $DRAFT --policy goodput) ;;
    *) echo "unknown server $name" >&2; exit 2 ;;
  esac
  specpilot serve --target $TARGET --max-length 1024 --max-batch "${MAX_BATCH:-4}" --port $PORT \
    "${flags[@]}" > "$OUT/$name.server.log" 2>&1 &
  PIDS+=($!)
  URLS+=(--url http://127.0.0.1:$PORT)
  for i in $(seq 300); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break; sleep 1; done
  PORT=$((PORT + 1))
done
specpilot bench-serve "${URLS[@]}" --concurrency "${CONCURRENCY:-1}" --requests "${REQUESTS:-12}" \
  --max-tokens 64 --timeout-s 1800 --prompts-file docs/eagle/heldout_24.jsonl \
  --json-out "$OUT/turns.json" | tee "$OUT/turns.txt"
