"""An independent draft model (a smaller model sharing the target's tokenizer).

The draft cache follows the committed sequence through a SyncedCache (one slot per batch row): a
proposal feeds whatever of the sequence is not yet cached (the last committed token, or also an
accepted last draft token plus the bonus), then drafts one token per forward.
"""

from __future__ import annotations

import time

import torch

from specpilot.config import SamplingConfig
from specpilot.errors import ConfigError
from specpilot.models.runner import CausalRunner
from specpilot.models.synced_cache import SyncedCache
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
        self.cache = SyncedCache(runner)

    def reset(self) -> None:
        self.cache.reset()

    def propose(
        self,
        sequence: list[int],
        budget: int,
        policy: DraftPolicy,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
    ) -> Proposal:
        return self.propose_batch([sequence], [0], [budget], [policy], sampling, [generator])[0]

    def propose_batch(
        self,
        sequences: list[list[int]],
        slots: list[int],
        budgets: list[int],
        policies: list[DraftPolicy],
        sampling: SamplingConfig,
        generators: list[torch.Generator | None],
    ) -> list[Proposal]:
        """Draft for every row at once: one draft forward per drafted position, over the rows
        still drafting (each row stops at its own budget or when its policy says so)."""
        start = time.perf_counter()
        feeds = [
            self.cache.sync(sequence, slot) for sequence, slot in zip(sequences, slots, strict=True)
        ]
        tokens: list[list[int]] = [[] for _ in sequences]
        probs: list[list[torch.Tensor]] = [[] for _ in sequences]
        raw: list[list[torch.Tensor]] = [[] for _ in sequences]
        drafting = [j for j, budget in enumerate(budgets) if budget > 0]
        while drafting:
            rows = self.runner.forward_batch(
                [feeds[j] for j in drafting], [slots[j] for j in drafting], "last", self.head
            )
            still = []
            for j, logits in zip(drafting, rows, strict=True):
                logits = logits[-1]
                self.cache.fed(feeds[j], slots[j])
                if sampling.greedy:
                    index = int(logits.argmax())
                else:
                    row = logits_to_probs(logits, sampling)
                    index = sample(row, generators[j])
                    probs[j].append(
                        row if self.vocabulary is None else self.vocabulary.to_full_probs(row)
                    )
                token = index if self.vocabulary is None else self.vocabulary.to_full_id(index)
                tokens[j].append(token)
                raw[j].append(logits)
                drafted = DraftToken(len(tokens[j]) - 1, token, logits)
                if policies[j].continue_drafting(drafted) and len(tokens[j]) < budgets[j]:
                    feeds[j] = [token]
                    still.append(j)
            drafting = still
        seconds = time.perf_counter() - start
        return [
            Proposal(t, torch.stack(p) if p else None, seconds, torch.stack(r) if r else None)
            for t, p, r in zip(tokens, probs, raw, strict=True)
        ]
