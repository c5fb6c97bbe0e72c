"""Prefix reuse: each runner records which tokens its cache slots hold, so any sequence fed to a
slot keeps the longest common prefix and feeds only the rest.

The same mechanism serves every cache: a draft or companion model following the committed
sequence (accepted drafts stay cached, rejected ones are forgotten), and the target and all
drafters across requests (a multi-turn conversation prefills only its new turn).

Invariant: a slot's record lists the tokens at its positions 0..n−1, in every layer, with n at
most the slot's length. It stays true whoever uses the runner (engines in a bench share one
target runner): the runner trims the record on every rollback and clears it on reset, every
write lands at or past the slot's length, and whoever feeds tokens through all layers records
them. Writes that are not recorded (a few layers, draft trees) only leave the record short.
"""

from __future__ import annotations


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix (C-speed when one is a prefix of the other)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class CachedTokens:
    """A runner's record of the tokens each slot holds (module docstring)."""

    def __init__(self, batch_size: int):
        self.slots: list[list[int]] = [[] for _ in range(batch_size)]
        self.floors = [0] * batch_size
        """Per slot, the shortest length the runner can roll back to other than 0 (a runner
        whose cache drops old states, e.g. sliding windows, raises it)."""

    def add(self, slot: int, tokens: list[int]) -> None:
        """Record tokens just fed (through every layer) after the recorded ones."""
        self.slots[slot].extend(tokens)

    def trim(self, slot: int, length: int) -> None:
        """Forget recorded positions >= length (the runner rolled back)."""
        del self.slots[slot][length:]

    def clear(self) -> None:
        for slot in range(len(self.slots)):
            self.slots[slot].clear()
            self.floors[slot] = 0

    def reusable(self, slot: int, tokens: list[int]) -> int:
        """How many leading `tokens` the slot holds and can keep (0: start over)."""
        keep = common_prefix_length(self.slots[slot], tokens)
        return keep if keep >= self.floors[slot] else 0


def sync(runner, sequence: list[int], slot: int) -> list[int]:
    """Roll the slot back to the longest prefix of `sequence` it holds, short of the last token;
    return the tokens still to feed (at least the last one, whose logits a caller needs). The
    caller records what it feeds (`runner.cached.add`)."""
    keep = runner.cached.reusable(slot, sequence[:-1])
    runner.rollback(keep, slot=slot)
    return sequence[keep:]
