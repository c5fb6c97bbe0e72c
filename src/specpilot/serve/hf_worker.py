"""`specpilot serve --backend hf-generate`: the baseline a user would otherwise script, a FIFO
queue answered one request at a time by transformers' own `model.generate` (with
`assistant_model`, transformers' assisted generation, when a draft is given).

It sits behind the same app, protocol and metrics as specpilot's engine, so `bench-serve` can put
the same load through both. Each request is a `Request` of the engine's kind, so its stop rule
(EOS, stop strings, max_tokens) and final text are the engine's: a stopping criterion hands each
step's new tokens to it, streams them and ends `generate` once the request has ended (a stop
string, or the client went away). Usage carries no speculation statistics (zeros): transformers
does not report them.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from specpilot.engine.request import Request, check_prompt
from specpilot.engine.stopping import StopChecker
from specpilot.errors import ConfigError
from specpilot.models import LoadedModel
from specpilot.models.chat import eos_token_ids
from specpilot.models.hf_adapter import generate_options
from specpilot.serve.worker import Worker


class HFGenerateWorker(Worker):
    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None):
        """`target` (and `draft`, the assistant) loaded with backend="hf" (their runners wrap
        the transformers model; see models.loading.load_model)."""
        runner = target.runner
        super().__init__(target.tokenizer, runner.vocab_size, slots=1)
        self.model = _transformers_model(target)
        self.assistant = None if draft is None else _transformers_model(draft)
        self.max_length = runner.max_length
        self.eos_ids = eos_token_ids(target.tokenizer, target.path)
        self.queue: deque[Request] = deque()
        self.current: Request | None = None
        self._lock = threading.Lock()  # guards `queue` against submitting threads

    @property
    def running(self) -> int:
        return int(self.current is not None)

    @property
    def waiting(self) -> int:
        return len(self.queue)

    @property
    def idle(self) -> bool:
        return not self.queue and self.current is None

    def _enqueue(self, prompt_ids, config, on_tokens, on_finish) -> Request:
        check_prompt(prompt_ids, self.max_length)
        stopper = StopChecker.for_request(config, self.eos_ids, self.tokenizer)
        request = Request(prompt_ids, config, stopper, None, on_tokens, on_finish)
        with self._lock:
            self.queue.append(request)
        return request

    def _step(self) -> None:
        with self._lock:
            request = self.current = self.queue.popleft()
        request.admitted_at = time.perf_counter()
        if not request.cancelled:
            self._generate(request)
        self._finish(request, "cancelled" if request.cancelled else request.reason or "length")

    def _generate(self, request: Request) -> None:
        ids = torch.tensor([request.prompt_ids], dtype=torch.long, device=self.model.device)
        options = generate_options(request.config, request.stopper.eos_ids)
        room = self.max_length - len(request.prompt_ids) + 1  # as Request.room
        options["max_new_tokens"] = min(options["max_new_tokens"], room)
        if self.assistant is not None:
            options["assistant_model"] = self.assistant
        torch.manual_seed(request.config.seed)  # generate samples from torch's global generator
        with torch.inference_mode():
            self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                stopping_criteria=StoppingCriteriaList([_Feed(request)]),
                **options,
            )

    def _finish(self, request: Request, reason: str) -> None:
        request.reason = reason
        request.stats.new_tokens = len(request.generated)
        request.stats.total_s = time.perf_counter() - request.admitted_at
        self.current = None
        request.finish(self.tokenizer)

    def _cancel_all(self) -> None:
        with self._lock:
            for request in [*self.queue, *filter(None, [self.current])]:
                request.cancel()

    def _fail(self) -> None:
        if self.current is not None:
            self._finish(self.current, "error")


class _Feed(StoppingCriteria):
    """Called by `generate` after every step with the sequence so far: commits the new tokens
    to the request (its stop rule cuts them), streams them, and stops generation once the
    request has ended or was cancelled."""

    def __init__(self, request: Request):
        self.request = request
        self.seen = len(request.prompt_ids)

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.BoolTensor:
        request = self.request
        new = input_ids[0, self.seen :].tolist()
        self.seen += len(new)
        if new and request.reason is None and not request.cancelled:
            kept = request.commit(new)
            if kept and request.on_tokens is not None:
                request.on_tokens(kept)
        done = request.reason is not None or request.cancelled
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


def _transformers_model(model: LoadedModel):
    hf_model = getattr(model.runner, "model", None)
    if hf_model is None:
        raise ConfigError(
            f"{model.name!r} is served by the lean decoder; the hf-generate backend needs the "
            "transformers model: load it with backend='hf'"
        )
    return hf_model
