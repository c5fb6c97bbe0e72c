"""Keep a side model's KV cache in step with a sequence it does not own (drafts, companions).

Such a model is told only the committed sequence each step. It remembers which tokens each cache
slot holds and, on the next call, rolls back to the longest common prefix with the new sequence
and feeds the rest: accepted drafts stay cached, rejected ones are forgotten.
"""

from __future__ import annotations

from specpilot.drafting.base import common_prefix_length
from specpilot.models.runner import CausalRunner


class SyncedCache:
    def __init__(self, runner: CausalRunner):
        self.runner = runner
        self.reset()

    def reset(self) -> None:
        self.runner.reset()
        self.cached: list[list[int]] = [[] for _ in range(self.runner.batch_size)]
        """Per slot, the tokens whose keys/values the runner holds, in order."""

    def sync(self, sequence: list[int], slot: int) -> list[int]:
        """Roll the slot back to what matches `sequence`; return the tokens still to feed (at
        least the last one, whose logits the caller needs)."""
        cached = self.cached[slot]
        keep = min(common_prefix_length(cached, sequence), len(sequence) - 1)
        self.runner.rollback(keep, slot=slot)
        del cached[keep:]
        return sequence[keep:]

    def fed(self, tokens: list[int], slot: int) -> None:
        """Record tokens just fed to the slot."""
        self.cached[slot].extend(tokens)
