"""The engine's thread: one background thread drives the scheduler (the engine is not
thread-safe and its steps block for the length of a forward), while the server's asyncio
handlers submit and cancel requests from the event loop and receive tokens through callbacks
(which they hand back to the loop with `call_soon_threadsafe`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from specpilot.config import GenerationConfig
from specpilot.engine import Request, Scheduler, SpeculativeEngine

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """More requests are waiting than the server queues (`--max-queue`): try again later."""


class EngineWorker:
    def __init__(self, engine: SpeculativeEngine, max_queue: int):
        self.engine = engine
        self.scheduler = Scheduler(engine)
        self.max_queue = max_queue
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def slots(self) -> int:
        return self.engine.target.batch_size

    @property
    def running(self) -> int:
        return len(self.scheduler.active)

    @property
    def waiting(self) -> int:
        return len(self.scheduler.waiting)

    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="specpilot-engine", daemon=True)
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
        the context cannot hold). The callbacks run on the engine thread."""
        if self.waiting >= self.max_queue:
            raise QueueFull(f"{self.waiting} requests are waiting (--max-queue {self.max_queue})")
        request = self.scheduler.submit(prompt_ids, config, on_tokens, on_finish)
        self._wake.set()
        return request

    def _run(self) -> None:
        while True:
            if self._stopping:
                self.scheduler.cancel_all()
            if self.scheduler.idle:
                if self._stopping:
                    return
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                self.scheduler.step()
            except Exception:  # a bug must not take the server down or leak slots
                log.exception("the engine failed; ending the requests it was decoding")
                self.scheduler.abort()
                self.engine.clear_cache()
