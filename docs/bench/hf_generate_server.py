"""The baseline `specpilot bench-serve` compares the server against (BENCHMARKS.md §9): what a user
would otherwise script, a FastAPI app answering OpenAI chat requests with transformers' own
`generate`, one request at a time (a lock; `generate` has no continuous batching), streamed
through `TextIteratorStreamer`. Greedy or sampled; usage reports the completion tokens.

    python docs/bench/hf_generate_server.py --port 8123 [--dtype bfloat16] \
        --model ~/.cache/specpilot/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer


def build_app(folder: str, dtype: torch.dtype, name: str) -> FastAPI:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    lock = threading.Lock()
    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": name, "object": "model"}]}

    @app.get("/health")
    def health():
        return {"status": "ok"}

    def generate(body: dict, streamer: TextIteratorStreamer, counts: dict) -> None:
        ids = tokenizer.apply_chat_template(
            body["messages"], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        temperature = float(body.get("temperature") or 0.0)
        options = {"do_sample": False}
        if temperature > 0:
            torch.manual_seed(int(body.get("seed") or 0))
            options = {"do_sample": True, "temperature": temperature}
            options["top_p"] = float(body.get("top_p") or 1.0)
        with lock, torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=int(body.get("max_tokens") or 128),
                streamer=streamer,
                pad_token_id=tokenizer.eos_token_id,
                **options,
            )
        counts.update(prompt_tokens=ids.shape[1], completion_tokens=out.shape[1] - ids.shape[1])

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        counts: dict = {}
        worker = threading.Thread(target=generate, args=(body, streamer, counts), daemon=True)
        worker.start()
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        pieces = asyncio.to_thread(lambda: list(streamer)) if not body.get("stream") else None
        if pieces is not None:
            text = "".join(await pieces)
            await asyncio.to_thread(worker.join)
            return JSONResponse(
                {
                    "id": rid, "object": "chat.completion", "created": created, "model": name,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {**counts, "total_tokens": sum(counts.values())},
                }
            )  # fmt: skip

        def chunk(**fields) -> str:
            head = {"id": rid, "object": "chat.completion.chunk", "created": created}
            return f"data: {json.dumps({**head, 'model': name, **fields})}\n\n"

        async def events():
            iterator = iter(streamer)
            while True:
                piece = await asyncio.to_thread(next, iterator, None)
                if piece is None:
                    break
                yield chunk(choices=[{"index": 0, "delta": {"content": piece}}])
            await asyncio.to_thread(worker.join)
            usage = {**counts, "total_tokens": sum(counts.values())}
            yield chunk(choices=[], usage=usage) + "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a transformers model folder")
    parser.add_argument("--name", help="the model id clients ask for (default: folder name)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args()
    name = args.name or args.model.rstrip("/").split("/")[-1]
    app = build_app(args.model, getattr(torch, args.dtype), name)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
