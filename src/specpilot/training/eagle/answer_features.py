"""The target's features of its own answers, kept while it writes them (`--feature-cache`).

A head's training prefills every answer once to read the target's taps and last hidden states
(features.py); for the 1.5B in bf16 on a 2-core EPYC that prefill was about three quarters of an
update. The answering forwards compute the same states position by position, so a recorder in
the engine's target pass keeps them for the committed positions, and each finished answer's
features go to the FeatureCache entry its training prefill would have written. Decoding stops
after sampling the last token, so one more forward of the batch's last tokens gives the last
position's hidden state (then the slots are rolled back as they were).

The numbers are a prefill's up to the rounding of other matrix shapes (decoding steps over a
batch instead of one forward over the sequence): to 1e-5 in float32 (tests), to bf16's
rounding in bf16. Plain decoding only (no drafter): every fed position is then committed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specpilot.engine.target_pass import TargetPass
from specpilot.errors import ConfigError
from specpilot.models.synced_cache import common_prefix_length
from specpilot.training.eagle.feature_cache import FeatureCache

if TYPE_CHECKING:  # data.py builds the recorder
    from specpilot.training.eagle.data import Sample


class _Recorded:
    """One slot's committed tokens and, per position, its taps and hidden state in one row."""

    def __init__(self):
        self.tokens: list[int] = []
        self.chunks: list[torch.Tensor] = []

    def add(self, start: int, tokens: list[int], rows: torch.Tensor) -> None:
        if start > len(self.tokens):
            raise RuntimeError(f"recorded features jump from {len(self.tokens)} to {start}")
        if start < len(self.tokens):  # a reused prefix, or positions fed again
            self.chunks = [torch.cat(self.chunks)[:start]] if start else []
            self.tokens = self.tokens[:start]
        self.chunks.append(rows)
        self.tokens += tokens

    def rows(self) -> torch.Tensor:
        return torch.cat(self.chunks)


class FeatureRecorder(TargetPass):
    """The target's plain-decoding forwards, tapping `feature_layers` and keeping, per slot, the
    committed positions' taps and last hidden states (module docstring)."""

    def __init__(self, target, feature_layers: tuple[int, ...], cache: FeatureCache):
        if not hasattr(target, "run_batch"):
            raise ConfigError(
                "recording the target's features while it answers needs the lean decoder "
                "backend (torch): answer on it, or drop --feature-cache"
            )
        super().__init__(target)
        self.feature_layers = tuple(feature_layers)
        self.cache = cache
        self.slots = [_Recorded() for _ in range(target.batch_size)]
        self._last: list[torch.Tensor | None] = []
        """Per row of the last forward: [n, (layers + 1) · hidden] its taps and hidden states."""

    def reusable(self, slot: int, prompt_ids: list[int]) -> int:
        recorded = self.slots[slot].tokens
        own = common_prefix_length(recorded, prompt_ids[:-1])
        return min(super().reusable(slot, prompt_ids), own)

    def trim(self, slot: int, prompt_ids: list[int]) -> None:
        """Keep no more of the target's cache than this slot has features for."""
        self.target.rollback(self.reusable(slot, prompt_ids), slot=slot)

    def forward(self, rows, slots, logits, trees=None):
        if trees is not None and any(tree is not None for tree in trees):
            raise ConfigError("the feature recorder serves plain decoding: answer without trees")
        outs = self.target.run_batch(rows, slots, logits=logits, tap_layers=self.feature_layers)
        self._last = [
            out and torch.cat([*(out.taps[k] for k in self.feature_layers), out.hidden], dim=-1)
            for out in outs
        ]
        return [out and out.logits for out in outs]

    def commit(self, row, slot, start, tokens, path):
        rows = self._last[row]
        if rows is not None:
            self.slots[slot].add(start, tokens, rows[: len(tokens)])

    @torch.inference_mode()
    def store(self, answers: list[Sample]) -> int:
        """Write each answer's features (its slot holds all its positions but the last) to the
        cache; return how many were written. Answers shorter than two tokens are skipped (no
        training position scores them)."""
        found = []
        for sample in answers:
            ids = sample.token_ids
            slot = next((s for s, rec in enumerate(self.slots) if rec.tokens == ids[:-1]), None)
            if slot is not None and len(sample.response_ids) >= 2:
                found.append((ids, slot))
        if not found:
            return 0
        last = self.target.run_batch(
            [[ids[-1]] for ids, _ in found], [slot for _, slot in found], logits="none"
        )
        for (ids, slot), out in zip(found, last, strict=True):
            self.target.rollback(len(ids) - 1, slot=slot)
            rows = self.slots[slot].rows()
            width = rows.shape[1] - out.hidden.shape[1]  # the taps' columns
            hidden = torch.cat([rows[1:, width:], out.hidden])
            self.cache.store(ids, rows[:, :width].contiguous(), hidden)
        return len(found)
