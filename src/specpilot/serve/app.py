"""The OpenAI-compatible HTTP API over one backend (FastAPI; streams as server-sent events).

Routes: POST /v1/completions and /v1/chat/completions (streamed or not), GET /v1/models,
/health and /metrics (Prometheus); with an API key, every /v1 route requires it (serve.auth).
Each call becomes one request of the backend's worker (serve.worker: the engine's scheduler, or
transformers' generate); its tokens come back through an asyncio queue. A client that
disconnects cancels its request, which frees its cache slot at the next step. Errors are OpenAI
error objects: 400 for bad input (malformed JSON, wrong types, unsupported fields, prompts the
context cannot hold), 401 for a missing or wrong API key, 404 for an unknown model, 503 with
Retry-After when the queue is full.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.requests import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from specpilot.config import GenerationConfig
from specpilot.engine import Request, SpeculativeEngine
from specpilot.errors import PromptError
from specpilot.models.chat import encode_prompt
from specpilot.serve.auth import APIKeyAuth, check_api_key
from specpilot.serve.metrics import Metrics
from specpilot.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    error_body,
)
from specpilot.serve.spec_stats import SpecStats
from specpilot.serve.text import TextStream
from specpilot.serve.worker import EngineWorker, QueueFull, Worker

MAX_BODY_BYTES = 8 * 2**20
"""Larger request bodies are refused before they are read (413)."""
log = logging.getLogger(__name__)
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}
"""The engine's finish reasons as OpenAI's."""


class APIError(Exception):
    def __init__(self, status: int, message: str, kind="invalid_request_error", **extra):
        super().__init__(message)
        self.status, self.kind, self.extra = status, kind, extra

    def response(self) -> JSONResponse:
        headers = self.extra.get("headers")
        body = error_body(str(self), self.kind, self.extra.get("param"), self.extra.get("code"))
        return JSONResponse(body, self.status, headers=headers)


def create_app(
    backend: SpeculativeEngine | Worker,
    model_name: str,
    defaults: GenerationConfig | None = None,
    max_queue: int = 256,
    retry_after_s: int = 1,
    api_key: str | None = None,
) -> FastAPI:
    """The server for `backend`: an engine (continuous batching; its target's batch_size is
    the most requests decoded at once) or a ready Worker (e.g. serve.hf_worker's baseline).
    `max_queue` more requests may wait for a slot; `defaults` fills omitted sampling fields
    and max_tokens; `api_key`, when given, is required on every /v1 route."""
    defaults = defaults or GenerationConfig()
    worker = backend if isinstance(backend, Worker) else EngineWorker(backend)
    worker.max_queue = max_queue
    metrics = Metrics(lambda: worker.running, lambda: worker.waiting, model_name)
    tokenizer = worker.tokenizer

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        worker.start()
        yield
        worker.stop()

    app = FastAPI(title="specpilot", lifespan=lifespan)
    app.state.worker, app.state.metrics = worker, metrics

    @app.middleware("http")
    async def limit_body(http_request: HTTPRequest, call_next):
        length = http_request.headers.get("content-length", "0")
        if not length.isdigit() or int(length) > MAX_BODY_BYTES:
            metrics.rejected.labels("too_large").inc()
            message = f"the request body must be at most {MAX_BODY_BYTES} bytes"
            return APIError(413, message).response()
        return await call_next(http_request)

    if check_api_key(api_key) is not None:  # added last, so it runs first: before the body
        reject = metrics.rejected.labels("unauthorized").inc
        app.add_middleware(APIKeyAuth, api_key=api_key, on_reject=reject)

    @app.exception_handler(APIError)
    async def api_error(_request, error: APIError):
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, error: RequestValidationError):
        metrics.rejected.labels("invalid").inc()
        problems = error.errors()
        first = problems[0] if problems else {}
        param = ".".join(str(part) for part in first.get("loc", ())[1:]) or None
        message = "; ".join(_describe(problem) for problem in problems[:5]) or "invalid request"
        return APIError(400, message, param=param).response()

    @app.exception_handler(Exception)
    async def failed(_request, error: Exception):
        log.exception("request failed", exc_info=error)
        return APIError(500, "internal server error; see the server log", "server_error").response()

    @app.exception_handler(HTTPException)
    async def http_error(_request, error: HTTPException):
        return APIError(error.status_code, str(error.detail), headers=error.headers).response()

    @app.get("/health")
    async def health():
        return {
            "status": "ok",
            "running": worker.running,
            "waiting": worker.waiting,
            "slots": worker.slots,
        }

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(model_name)]}

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http_request: HTTPRequest):
        if isinstance(body.prompt, str):
            prompt_ids = _encode(lambda: encode_prompt(tokenizer, body.prompt, chat=False))
        else:
            prompt_ids = _check_ids(body.prompt, worker.vocab_size)
        return await answer(body, prompt_ids, http_request, _completion_shape)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, http_request: HTTPRequest):
        messages = [message.as_dict() for message in body.messages]
        prompt_ids = _encode(lambda: encode_prompt(tokenizer, messages))
        return await answer(body, prompt_ids, http_request, _chat_shape)

    async def answer(body: SamplingFields, prompt_ids, http_request, shape) -> Response:
        if body.model != model_name:
            message = f"the model {body.model!r} does not exist; this server serves {model_name!r}"
            raise APIError(404, message, param="model", code="model_not_found")
        config = body.generation_config(defaults)
        call = _Call(prompt_ids, metrics)
        try:
            call.request = worker.submit(prompt_ids, config, call.on_tokens, call.on_finish)
        except QueueFull as error:
            metrics.rejected.labels("queue_full").inc()
            headers = {"Retry-After": str(retry_after_s)}
            raise APIError(503, f"{error}: retry later", "server_busy", headers=headers) from None
        except PromptError as error:
            metrics.rejected.labels("invalid").inc()
            raise APIError(400, str(error), param="prompt") from None
        envelope = shape(model_name)
        if body.stream:
            stream = TextStream(tokenizer, config.stop_strings)
            events = _sse(call.events(http_request), envelope, stream, body.include_usage)
            return StreamingResponse(events, media_type="text/event-stream")
        async for _ in call.events(http_request):
            pass
        return _final(call.request, envelope, len(prompt_ids))

    return app


class _Call:
    """One HTTP call's bridge to its engine request: the engine thread's callbacks put token
    lists and finally the finished Request on an asyncio queue of the event loop, and record
    the request's metrics (also when its client has gone)."""

    def __init__(self, prompt_ids: list[int], metrics: Metrics):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.request: Request | None = None
        self.prompt_tokens = len(prompt_ids)
        self.metrics = metrics
        self.arrived = time.perf_counter()
        self.first_token: float | None = None

    def _put(self, item) -> None:  # from the engine thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop has closed: the server is shutting down
            pass

    def on_tokens(self, tokens: list[int]) -> None:
        if self.first_token is None:
            self.first_token = time.perf_counter()
        self._put(tokens)

    def on_finish(self, request: Request) -> None:
        self._record(request)
        self._put(request)

    async def events(self, http_request: HTTPRequest) -> AsyncIterator[list[int] | Request]:
        """Token lists, then the finished Request; ends early (cancelling the request, which
        frees its slot) if the client disconnects."""
        watcher = asyncio.create_task(self._watch(http_request))
        try:
            while True:
                item = await self.queue.get()
                if item is None:  # the client went away
                    return
                yield item
                if isinstance(item, Request):
                    return
        finally:
            watcher.cancel()
            if self.request.result is None:
                self.request.cancel()

    async def _watch(self, http_request: HTTPRequest) -> None:
        while (await http_request.receive())["type"] != "http.disconnect":
            pass
        self.queue.put_nowait(None)

    def _record(self, request: Request) -> None:
        result = request.result
        now = time.perf_counter()
        label = FINISH_REASONS.get(result.finish_reason, result.finish_reason)
        self.metrics.finished(label, self.prompt_tokens, result.stats)
        self.metrics.e2e.observe(now - self.arrived)
        if self.first_token is not None:
            self.metrics.ttft.observe(self.first_token - self.arrived)
            if len(result.token_ids) > 1:
                tpot = (now - self.first_token) / (len(result.token_ids) - 1)
                self.metrics.tpot.observe(tpot)


def _encode(encode: Callable[[], list[int]]) -> list[int]:
    try:
        return encode()
    except PromptError as error:
        raise APIError(400, str(error), param="prompt") from None


def _check_ids(ids: list[int], vocab_size: int) -> list[int]:
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        message = f"token ids must be in 0..{vocab_size - 1}, got {bad[0]}"
        raise APIError(400, message, param="prompt")
    return ids


def _describe(problem: dict) -> str:
    where = ".".join(str(part) for part in problem.get("loc", ()) if part != "body")
    message = problem.get("msg", "invalid value").removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _model_card(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "specpilot"}


def _usage(prompt_tokens: int, request: Request) -> dict:
    """OpenAI's usage plus the request's speculation statistics."""
    result = request.result
    completion = len(result.token_ids)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "speculative_decoding": SpecStats.of(result.stats).usage(),
    }


class _Shape:
    """How one endpoint's responses and stream chunks look."""

    def __init__(self, prefix, obj, chunk_obj, model, choice: Callable, delta: Callable):
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.obj, self.chunk_obj, self.model = obj, chunk_obj, model
        self.created = int(time.time())
        self.choice, self.delta = choice, delta

    def envelope(self, obj: str, choices: list, **extra) -> dict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }


def _completion_shape(model: str) -> _Shape:
    return _Shape(
        "cmpl",
        "text_completion",
        "text_completion",
        model,
        lambda text: {"text": text},
        lambda text, first: {"text": text},
    )


def _chat_shape(model: str) -> _Shape:
    return _Shape(
        "chatcmpl",
        "chat.completion",
        "chat.completion.chunk",
        model,
        lambda text: {"message": {"role": "assistant", "content": text}},
        lambda text, first: {
            "delta": {"role": "assistant", "content": text} if first else {"content": text}
        },
    )


def _check_finished(request: Request) -> str:
    """OpenAI's finish reason, or an APIError for a request the server could not finish."""
    reason = request.result.finish_reason
    if reason == "error":
        raise APIError(500, "the engine failed on this request; see the server log", "server_error")
    if reason == "cancelled":
        raise APIError(503, "the server is shutting down", "server_busy")
    return FINISH_REASONS[reason]


def _final(request: Request, shape: _Shape, prompt_tokens: int) -> JSONResponse:
    if request.result is None:  # the client is gone; nobody reads this
        return JSONResponse(error_body("cancelled"), 499)
    reason = _check_finished(request)
    choice = {
        "index": 0,
        **shape.choice(request.result.text),
        "logprobs": None,
        "finish_reason": reason,
    }
    body = shape.envelope(shape.obj, [choice], usage=_usage(prompt_tokens, request))
    return JSONResponse(body)


async def _sse(events, shape: _Shape, stream: TextStream, include_usage: bool):
    """Server-sent events: a chunk per step with new text, a last chunk with the finish
    reason (and usage when asked for), then [DONE]."""

    def event(data: dict) -> str:
        return f"data: {json.dumps(data)}\n\n"

    def chunk(text: str, reason: str | None, first: bool = False) -> str:
        choice = {"index": 0, **shape.delta(text, first), "logprobs": None, "finish_reason": reason}
        return event(shape.envelope(shape.chunk_obj, [choice]))

    first = True
    async for item in events:
        if isinstance(item, Request):
            try:
                reason = _check_finished(item)
            except APIError as error:
                yield event(error_body(str(error), error.kind))
                break
            yield chunk(stream.finish(item.result.text), reason, first)
            if include_usage:
                usage = _usage(len(item.prompt_ids), item)
                yield event(shape.envelope(shape.chunk_obj, [], usage=usage))
            break
        text = stream.add(item)
        if text or first:
            yield chunk(text, None, first)
            first = False
    yield "data: [DONE]\n\n"
