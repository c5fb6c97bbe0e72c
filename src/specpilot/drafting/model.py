"""An independent draft model (a smaller model sharing the target's tokenizer).

Invariant: `self.cached` lists the tokens whose keys/values the draft runner holds, in order. A
proposal feeds whatever of the sequence is not yet cached (the last committed token, or also an
accepted last draft token plus the bonus), then drafts one token per forward.
"""

from __future__ import annotations

import time

import torch

from specpilot.config import SamplingConfig
from specpilot.drafting.base import common_prefix_length
from specpilot.errors import ConfigError
from specpilot.models.runner import CausalRunner
from specpilot.models.vocab import DraftVocabulary
from specpilot.policies.base import DraftPolicy, DraftToken
from specpilot.sampling import logits_to_probs, sample
from specpilot.types import Proposal


class ModelDrafter:
    def __init__(self, runner: CausalRunner, vocabulary: DraftVocabulary | None = None):
        """`vocabulary`: score only these ids (needs a runner with `run`/`logits_from_hidden`)."""
        if vocabulary is not None and not hasattr(runner, "logits_from_hidden"):
            raise ConfigError(
                "a reduced draft vocabulary needs the lean decoder backend (Llama/Qwen2 family)"
            )
        self.runner = runner
        self.vocabulary = vocabulary
        self.head = None if vocabulary is None else vocabulary.head(runner.lm_head)
        self.cached: list[int] = []

    def _next_logits(self, feed: list[int]) -> torch.Tensor:
        """[vocab] (or [subset]) draft logits for the position after `feed`."""
        if self.vocabulary is None:
            return self.runner.forward(feed, logits="last")[-1]
        hidden = self.runner.run(feed, logits="none").hidden[-1:]
        return self.runner.logits_from_hidden(hidden, self.head)[-1]

    def reset(self) -> None:
        self.runner.reset()
        self.cached = []

    def _sync(self, sequence: list[int]) -> list[int]:
        """Roll the cache back to what still matches `sequence`; return the tokens to feed."""
        keep = min(common_prefix_length(self.cached, sequence), len(sequence) - 1)
        self.runner.rollback(keep)
        del self.cached[keep:]
        return sequence[keep:]

    def propose(
        self,
        sequence: list[int],
        budget: int,
        policy: DraftPolicy,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
    ) -> Proposal:
        start = time.perf_counter()
        feed = self._sync(sequence)
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        while len(tokens) < budget:
            logits = self._next_logits(feed)
            self.cached.extend(feed)
            if sampling.greedy:
                index = int(logits.argmax())
            else:
                row = logits_to_probs(logits, sampling)
                index = sample(row, generator)
                probs.append(row if self.vocabulary is None else self.vocabulary.to_full_probs(row))
            token = index if self.vocabulary is None else self.vocabulary.to_full_id(index)
            tokens.append(token)
            if not policy.continue_drafting(DraftToken(len(tokens) - 1, token, logits)):
                break
            feed = [token]
        draft_probs = torch.stack(probs) if probs else None
        return Proposal(tokens, draft_probs, time.perf_counter() - start)
