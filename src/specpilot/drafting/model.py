"""An independent draft model (a smaller model sharing the target's tokenizer).

The draft cache follows the committed sequence by prefix reuse (one slot per batch row,
models.synced_cache): a proposal feeds whatever of the sequence is not yet cached (the last
committed token, an accepted last draft token plus the bonus, or a new turn of a conversation),
then drafts one token per forward.
"""

from __future__ import annotations

import torch

from specpilot.config import SamplingConfig, require
from specpilot.drafting.chains import draft_chains
from specpilot.errors import ConfigError
from specpilot.models.runner import CausalRunner
from specpilot.models.synced_cache import sync
from specpilot.models.vocab import DraftVocabulary
from specpilot.policies.base import DraftPolicy
from specpilot.types import Proposal


class ModelDrafter:
    def __init__(
        self,
        runner: CausalRunner,
        vocabulary: DraftVocabulary | None = None,
        branches: int = 1,
    ):
        """`vocabulary`: score only these ids (needs a runner with `run`/`logits_from_hidden`).
        `branches` > 1: propose trees, the draft's top `branches` first tokens (drafting.chains).
        """
        require(branches >= 1, f"branches must be >= 1 (1 drafts chains), got {branches}")
        if vocabulary is not None and not hasattr(runner, "logits_from_hidden"):
            raise ConfigError(
                "a reduced draft vocabulary needs the lean decoder backend (Llama/Qwen2 family)"
            )
        self.runner = runner
        self.vocabulary = vocabulary
        self.branches = branches
        self.head = None if vocabulary is None else vocabulary.head(runner.lm_head)

    def reset(self) -> None:
        pass

    def clear_cache(self) -> None:
        self.runner.reset()

    def propose(
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
        feeds = [
            sync(self.runner, sequence, slot)
            for sequence, slot in zip(sequences, slots, strict=True)
        ]

        def score(rows: list[int], row_feeds: list[list[int]]) -> torch.Tensor:
            row_slots = [slots[j] for j in rows]
            outs = self.runner.forward_batch(row_feeds, row_slots, "last", self.head)
            for feed, slot in zip(row_feeds, row_slots, strict=True):
                self.runner.cached.add(slot, feed)
            return torch.cat(outs)

        return draft_chains(
            score, feeds, budgets, policies, sampling, generators, self.vocabulary, self.branches
        )
