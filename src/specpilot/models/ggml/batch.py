"""A reusable `llama_batch`: tokens with their positions, sequence ids and output flags.

One batch holds the new tokens of every row of a forward (each row in its slot's sequence,
tree nodes in several sequences at once), so llama.cpp reads the weights once for all rows.
It grows when a forward needs more tokens or sequence ids per token than it has room for.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One token of a forward: where it sits, which sequences see it, whether it is scored."""

    token: int
    pos: int
    seqs: tuple[int, ...]
    output: bool


class Batch:
    """A llama_batch allocated by libllama and refilled for every decode."""

    def __init__(self, llama):
        self._llama = llama
        self._raw = None
        self._tokens = self._seqs = 0

    def fill(self, entries: list[Entry]):
        """The batch holding `entries` (valid until the next fill)."""
        seqs = max(len(entry.seqs) for entry in entries)
        if len(entries) > self._tokens or seqs > self._seqs:
            self._allocate(max(len(entries), self._tokens), max(seqs, self._seqs))
        raw = self._raw
        for i, entry in enumerate(entries):
            raw.token[i] = entry.token
            raw.pos[i] = entry.pos
            raw.n_seq_id[i] = len(entry.seqs)
            ids = raw.seq_id[i]
            for k, seq in enumerate(entry.seqs):
                ids[k] = seq
            raw.logits[i] = entry.output
        raw.n_tokens = len(entries)
        return raw

    def _allocate(self, tokens: int, seqs: int) -> None:
        self.free()
        self._raw = self._llama.llama_batch_init(tokens, 0, seqs)
        self._tokens, self._seqs = tokens, seqs

    def free(self) -> None:
        if self._raw is not None:
            self._llama.llama_batch_free(self._raw)
            self._raw = None
            self._tokens = self._seqs = 0
