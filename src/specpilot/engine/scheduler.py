"""Continuous batching: requests join a running batch between steps and leave it the moment
they finish, so a finished row's cache slot serves the next waiting request instead of idling
until the whole batch ends.

Each `step()` (1) retires cancelled requests, (2) admits waiting requests into free slots (each
into the free slot holding the longest prefix of its prompt, so a conversation's next turn or a
shared system prompt is not prefilled again) and prefills them together, (3) runs one engine
step over every row whose prompt is in the cache (draft → select → verify in one target
forward, each row accepting its own number of tokens), (4) retires the rows that finished.

Chunked prefill (`prefill_chunk`): a step prefills at most that many prompt tokens, the
earliest admitted rows first, so a burst of long prompts is read over several steps while the
running rows keep decoding between them, instead of stalling them for one forward over every
waiting prompt (the running rows' latency per token is bounded; a new request's first token
comes later). `SpeculativeEngine.
generate_batch` is this loop run to the end with every prompt admitted at once; its caller waits
for the last row, so it asks a batch planner to finish the batch soonest (`finish_together`)
rather than to emit the most tokens per second.

Every row has its own config, stop rule, draft-policy copy and random generator, so a request's
output does not depend on what it is batched with (greedy exactly, in float32; sampled: the same
tokens for the same seed) unless a rule couples rows (SV's batch allocation, a DVI head learning
online; docs/methods.md §1.3).

Threads: `submit` and `Request.cancel` may be called from any thread; `step` from one thread
only (the one driving the engine).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from specpilot.config import GenerationConfig
from specpilot.engine.request import Request
from specpilot.errors import ConfigError
from specpilot.models.chat import Messages

if TYPE_CHECKING:
    from specpilot.engine.speculative import SpeculativeEngine


class Scheduler:
    def __init__(
        self,
        engine: SpeculativeEngine,
        finish_together: bool = False,
        prefill_chunk: int | None = None,
    ):
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ConfigError(f"the prefill chunk must be >= 1 token, got {prefill_chunk}")
        self.engine = engine
        self.finish_together = finish_together
        """The caller waits for the whole batch: while no request waits for a slot, the goodput
        controller minimises the time until the last row finishes (docs/methods.md §7.5)."""
        self.prefill_chunk = prefill_chunk
        """The most prompt tokens one step prefills (None: every admitted prompt at once)."""
        self.waiting: deque[Request] = deque()
        self.active: list[Request] = []
        self.free = list(range(engine.target.batch_size))
        self._lock = threading.Lock()  # guards `waiting` against submitting threads

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.active

    def submit(
        self,
        prompt: str | Messages | list[int],
        config: GenerationConfig | None = None,
        on_tokens: Callable[[list[int]], None] | None = None,
        on_finish: Callable[[Request], None] | None = None,
    ) -> Request:
        """Queue a prompt (text and messages go through the chat template; token ids are used
        as they are). `on_tokens(tokens)` streams each step's new tokens and
        `on_finish(request)` reports the end, both from the thread calling `step`. Raises
        PromptError for an empty or too long prompt."""
        engine = self.engine
        config = config or GenerationConfig()
        request = Request(
            engine.encode(prompt),
            config,
            engine.stop_rule(config),
            engine.draft_policy,
            on_tokens,
            on_finish,
        )
        with self._lock:
            self.waiting.append(request)
        return request

    def run(self) -> None:
        """Step until every submitted request has finished."""
        while not self.idle:
            self.step()

    def step(self) -> list[Request]:
        """Admit, decode one step, retire; return the requests that finished in this call."""
        with self._lock:
            cancelled = [r for r in (*self.waiting, *self.active) if r.cancelled]
            self.waiting = deque(r for r in self.waiting if not r.cancelled)
        finished = self._retire(cancelled, "cancelled")
        self._admit()
        pending = [row for row in self.active if not row.prefilled]
        if pending:
            self.engine.prefill(pending, self.prefill_chunk)
        max_length = self.engine.target.max_length
        for row in self.active:
            if row.room(max_length) <= 0:
                row.reason = "length"
        running = [row for row in self.active if row.reason is None and row.prefilled]
        if running:
            draining = self.finish_together and not self.waiting
            self.engine.step(running, finish_together=draining)
        return finished + self._retire([row for row in self.active if row.reason is not None])

    def cancel_all(self) -> None:
        """Cancel every queued and running request (they end at the next step)."""
        with self._lock:
            for request in [*self.waiting, *self.active]:
                request.cancel()

    def abort(self) -> list[Request]:
        """End every request with finish_reason "error" (the engine failed mid-step: the
        caller should also `engine.clear_cache()`, as the slots' caches may be inconsistent)."""
        with self._lock:
            requests = [*self.waiting, *self.active]
            self.waiting.clear()
        return self._retire(requests, "error")

    def _retire(self, requests: list[Request], reason: str | None = None) -> list[Request]:
        """Free the slots of finished requests (ended for `reason` if given) and report them."""
        now = time.perf_counter()
        for request in requests:
            request.reason = reason or request.reason
            if request.slot is not None:
                self.active.remove(request)
                self.free.append(request.slot)
                request.slot = None
                request.stats.total_s = now - request.admitted_at
            if self.engine.planner is not None and request.policy is not None:
                self.engine.planner.retire(request.policy)
            request.finish(self.engine.tokenizer)
        return requests

    def _admit(self) -> None:
        """Move waiting requests into free slots (the next `step` prefills them)."""
        if not self.waiting or not self.free:
            return
        if not self.active:
            self.engine.reset()  # a new batch starts: no row holds per-request state
        admitted = []
        while self.waiting and self.free:
            with self._lock:
                request = self.waiting.popleft()
            request.slot = max(self.free, key=lambda s: (self.engine.reusable(s, request), -s))
            self.free.remove(request.slot)
            admitted.append(request)
        start = time.perf_counter()
        for request in admitted:
            request.admitted_at = start
        self.active.extend(admitted)
