"""The backend's thread: one background thread decodes (a model is not thread-safe and its
forwards block), while the server's asyncio handlers submit and cancel requests from the event
loop and receive tokens through callbacks (which they hand back to the loop with
`call_soon_threadsafe`).

`Worker` is what the app sees: submit, the queue's size, start and stop. Two backends fill it
in: `EngineWorker` (specpilot's engine with continuous batching) and, as the baseline a user
would otherwise script, `serve.hf_worker.HFGenerateWorker` (transformers' `generate`, one
request at a time)."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable

from specpilot.config import GenerationConfig
from specpilot.engine import Request, Scheduler, SpeculativeEngine

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """More requests are waiting than the server queues (`--max-queue`): try again later."""


class Worker(ABC):
    """One backend on one thread. Subclasses decode in `_step` (called on that thread while
    `idle` is false); the callbacks of `submit` run there too.

    By default `start` gives the backend a thread of its own. `specpilot serve` instead sets
    `own_thread = False` and decodes on the main thread (`drive`), with the HTTP server on another:
    torch's CPU kernels ran ~1.7x faster on the main thread than on a new one here (SmolLM2 bf16,
    38.7 vs 22.6 tok/s; its OpenMP team lives there), whatever torch.set_num_threads says."""

    def __init__(self, tokenizer, vocab_size: int, slots: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.slots = slots
        """The most requests decoded at once."""
        self.max_queue = 256
        """Requests that may wait; more get QueueFull (create_app sets it)."""
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.own_thread = True
        """False: `start` starts nothing and the caller runs `drive`."""

    @property
    @abstractmethod
    def running(self) -> int: ...

    @property
    @abstractmethod
    def waiting(self) -> int: ...

    @property
    @abstractmethod
    def idle(self) -> bool: ...

    @abstractmethod
    def _enqueue(self, prompt_ids, config, on_tokens, on_finish) -> Request:
        """Queue a request (PromptError for a prompt the context cannot hold)."""

    @abstractmethod
    def _step(self) -> None:
        """Decode some work of the queue (on the worker thread)."""

    @abstractmethod
    def _cancel_all(self) -> None:
        """Cancel every queued and running request (they end in coming steps)."""

    @abstractmethod
    def _fail(self) -> None:
        """End the requests a failed `_step` was decoding with finish_reason "error"."""

    def start(self) -> None:
        self._stopping = False
        if self.own_thread:
            self._thread = threading.Thread(target=self.drive, name="specpilot-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Cancel what is queued or running and end the thread."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def submit(
        self,
        prompt_ids: list[int],
        config: GenerationConfig,
        on_tokens: Callable[[list[int]], None],
        on_finish: Callable[[Request], None],
    ) -> Request:
        """Queue a request (QueueFull when `max_queue` are waiting; PromptError for a prompt
        the context cannot hold). The callbacks run on the worker thread."""
        if self.waiting >= self.max_queue:
            raise QueueFull(f"{self.waiting} requests are waiting (max_queue {self.max_queue})")
        request = self._enqueue(prompt_ids, config, on_tokens, on_finish)
        self._wake.set()
        return request

    def drive(self) -> None:
        """Decode on the calling thread until `stop`."""
        while True:
            if self._stopping:
                self._cancel_all()
            if self.idle:
                if self._stopping:
                    return
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                self._step()
            except Exception:  # a bug must not take the server down or leak slots
                log.exception("the backend failed; ending the requests it was decoding")
                self._fail()


class EngineWorker(Worker):
    """specpilot's engine: the scheduler's continuous batching, `slots` = the target's batch
    size; `prefill_chunk`: the most prompt tokens one step prefills (engine.scheduler)."""

    def __init__(self, engine: SpeculativeEngine, prefill_chunk: int | None = None):
        target = engine.target
        super().__init__(engine.tokenizer, target.vocab_size, target.batch_size)
        self.engine = engine
        self.scheduler = Scheduler(engine, prefill_chunk=prefill_chunk)

    @property
    def running(self) -> int:
        return len(self.scheduler.active)

    @property
    def waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def idle(self) -> bool:
        return self.scheduler.idle

    def _enqueue(self, prompt_ids, config, on_tokens, on_finish) -> Request:
        return self.scheduler.submit(prompt_ids, config, on_tokens, on_finish)

    def _step(self) -> None:
        self.scheduler.step()

    def _cancel_all(self) -> None:
        self.scheduler.cancel_all()

    def _fail(self) -> None:
        self.scheduler.abort()
        self.engine.clear_cache()  # the slots' caches may be inconsistent
