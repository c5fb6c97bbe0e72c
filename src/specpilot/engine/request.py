"""One request as the decode loop sees it: its prompt, its own generation config, stop rule,
draft-policy copy, random generator and statistics, the cache slot it holds while it runs, and
the callbacks that stream its tokens and report its end.

Everything that makes a row's output depend only on its own request lives here, so rows can be
admitted into and retired from a running batch (engine.scheduler) without changing each
other's tokens."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specpilot.config import GenerationConfig
from specpilot.engine.stats import GenerationStats
from specpilot.engine.stopping import StopChecker
from specpilot.errors import PromptError
from specpilot.policies.base import DraftPolicy


def check_prompt(prompt_ids: list[int], max_length: int) -> None:
    """PromptError unless the prompt is non-empty and leaves room in a context of max_length."""
    if not prompt_ids:
        raise PromptError("the prompt is empty: give at least one token of input")
    if len(prompt_ids) >= max_length:
        raise PromptError(
            f"the prompt has {len(prompt_ids)} tokens but the context holds {max_length}: "
            "shorten the prompt or load the model with a larger max_length"
        )


@dataclass
class GenerationResult:
    token_ids: list[int]
    """New tokens only (an EOS that ended generation included)."""
    text: str
    finish_reason: str
    """"eos", "stop" (a stop string), "length" (max_new_tokens or the context end),
    "cancelled" (Request.cancel), "error" (the engine failed; Scheduler.abort)."""
    stats: GenerationStats


class Request:
    """A prompt being (or waiting to be) decoded; `cancel()` may be called from any thread."""

    def __init__(
        self,
        prompt_ids: list[int],
        config: GenerationConfig,
        stopper: StopChecker,
        policy: DraftPolicy | None,
        on_tokens: Callable[[list[int]], None] | None = None,
        on_finish: Callable[[Request], None] | None = None,
    ) -> None:
        self.prompt_ids = prompt_ids
        self.config = config
        self.stopper = stopper
        self.policy = copy.deepcopy(policy)  # None: decoded without drafting (serve's baseline)
        if self.policy is not None:
            self.policy.reset()
        self.generator = torch.Generator().manual_seed(config.seed)
        self.on_tokens = on_tokens
        self.on_finish = on_finish
        self.slot: int | None = None
        """The cache slot while the request runs (None while waiting and once finished)."""
        self.admitted_at = 0.0
        """time.perf_counter() when it was admitted (its prefill began)."""
        self.prefilled = False
        """Its prompt (all but the last token, which the first step feeds) is in the cache."""
        self.generated: list[int] = []
        self.sequence = prompt_ids
        self.stats = GenerationStats()
        self.reason: str | None = None
        self.cancelled = False
        self.result: GenerationResult | None = None
        """Set once the request has finished (before on_finish is called)."""

    def cancel(self) -> None:
        """Stop at the next step boundary and free the slot (finish_reason "cancelled")."""
        self.cancelled = True

    def room(self, max_length: int) -> int:
        """Tokens this row may still emit (new-token limit and context end)."""
        return min(
            self.config.max_new_tokens - len(self.generated),
            max_length - len(self.sequence) + 1,
        )

    def commit(self, emitted: list[int]) -> list[int]:
        """Append a step's tokens, cut at a stop; return the tokens actually appended."""
        checked = len(self.generated)
        self.generated.extend(emitted)
        keep, self.reason = self.stopper.cut(self.generated, checked)
        del self.generated[keep:]
        self.sequence = self.prompt_ids + self.generated
        return emitted[: keep - checked]

    def finish(self, tokenizer) -> GenerationResult:
        """Build the result (text decoded, cut before a stop string) and report it."""
        text = tokenizer.decode(self.generated, skip_special_tokens=True)
        if self.reason == "stop":
            text = self.stopper.trim_text(text)
        self.result = GenerationResult(self.generated, text, self.reason, self.stats)
        if self.on_finish is not None:
            self.on_finish(self)
        return self.result
