"""The decode loop: draft → select → verify (one target forward) → commit / roll back → observe.

One loop serves every method: plain decoding is the same loop with no drafter (each step verifies
zero drafted tokens and emits the target's own token, through the same runner and sampler), and
adaptive methods plug in as drafters and policies without touching this file.

Invariant: after every step the target cache holds exactly len(sequence) − 1 positions; the last
committed token is fed at the start of the next step together with the drafted tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specpilot.config import GenerationConfig
from specpilot.drafting.base import Drafter
from specpilot.engine.stats import GenerationStats
from specpilot.engine.stopping import StopChecker
from specpilot.errors import PromptError
from specpilot.models.chat import Messages, encode_prompt
from specpilot.models.runner import CausalRunner
from specpilot.policies.base import DraftPolicy, VerifyPolicy
from specpilot.policies.draft import ConstantPolicy
from specpilot.policies.verify import VerifyAll
from specpilot.types import Proposal, StepRecord
from specpilot.verify.rules import verify


@dataclass
class GenerationResult:
    token_ids: list[int]
    """New tokens only (an EOS that ended generation included)."""
    text: str
    finish_reason: str
    """"eos", "stop" (a stop string), "length" (max_new_tokens or the context end)."""
    stats: GenerationStats


class SpeculativeEngine:
    """Lossless speculative decoding of one target with a pluggable drafter and policies.

    With `drafter=None` it is plain autoregressive decoding (the baseline)."""

    def __init__(
        self,
        target: CausalRunner,
        tokenizer,
        drafter: Drafter | None = None,
        draft_policy: DraftPolicy | None = None,
        verify_policy: VerifyPolicy | None = None,
        eos_ids: frozenset[int] | set[int] | None = None,
    ):
        self.target = target
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.draft_policy = draft_policy or ConstantPolicy()
        self.verify_policy = verify_policy or VerifyAll()
        if eos_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            eos_ids = set() if eos is None else {eos}
        self.eos_ids = frozenset(eos_ids)

    def generate(
        self,
        prompt: str | Messages | list[int],
        config: GenerationConfig | None = None,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> GenerationResult:
        """Continue a prompt: text or chat messages (formatted with the chat template) or token ids.

        `on_tokens` receives each step's new tokens, for streaming."""
        config = config or GenerationConfig()
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) and prompt:
            prompt_ids = list(prompt)
        else:
            prompt_ids = encode_prompt(self.tokenizer, prompt)
        self._check_prompt(prompt_ids)
        sampling = config.sampling
        generator = torch.Generator().manual_seed(config.seed)
        stopper = StopChecker(
            self.eos_ids if config.stop_on_eos else frozenset(),
            config.stop_strings,
            config.max_new_tokens,
            self.tokenizer.decode,
        )
        stats = GenerationStats()
        start = time.perf_counter()
        self.target.reset()
        self.target.forward(prompt_ids[:-1], logits="none")
        for plug in (self.drafter, self.draft_policy, self.verify_policy):
            if plug is not None:
                plug.reset()
        stats.prefill_s = time.perf_counter() - start

        sequence = prompt_ids
        generated: list[int] = []
        reason = None
        while reason is None:
            room = min(
                config.max_new_tokens - len(generated), self.target.max_length - len(sequence) + 1
            )
            if room <= 0:
                reason = "length"
                break
            budget = min(self.draft_policy.draft_budget(), room - 1)
            proposal = Proposal([])
            if self.drafter is not None and budget > 0:
                proposal = self.drafter.propose(
                    sequence, budget, self.draft_policy, sampling, generator
                )
            num_drafted = proposal.k
            proposal = proposal.truncated(self.verify_policy.select(proposal))
            verify_start = time.perf_counter()
            target_logits = self.target.forward([sequence[-1], *proposal.tokens])  # [k + 1, vocab]
            result = verify(
                proposal.tokens, proposal.draft_probs, target_logits, sampling, generator
            )
            emitted = result.emitted(proposal.tokens)
            checked = len(generated)
            generated.extend(emitted)
            keep, reason = stopper.cut(generated, checked)
            del generated[keep:]
            emitted = emitted[: keep - checked]
            sequence = prompt_ids + generated
            self.target.rollback(len(sequence) - 1)
            record = StepRecord(
                num_drafted=num_drafted,
                num_verified=len(proposal.tokens),
                num_accepted=result.num_accepted,
                num_emitted=len(emitted),
                draft_s=proposal.draft_s,
                verify_s=time.perf_counter() - verify_start,
                context_len=len(sequence),
            )
            stats.add(record)
            self.draft_policy.observe(record)
            self.verify_policy.observe(record)
            if on_tokens is not None and emitted:
                on_tokens(emitted)
            if reason is None and len(sequence) >= self.target.max_length:
                reason = "length"
        stats.total_s = time.perf_counter() - start
        text = self.tokenizer.decode(generated, skip_special_tokens=True)
        if reason == "stop":
            text = stopper.trim_text(text)
        return GenerationResult(generated, text, reason, stats)

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise PromptError("the prompt is empty: give at least one token of input")
        if len(prompt_ids) >= self.target.max_length:
            raise PromptError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds "
                f"{self.target.max_length}: "
                "shorten the prompt or load the model with a larger max_length"
            )
