"""The lean decoder's static KV cache: `batch_size` slots with per-layer lengths, where rollback
is lowering a length, plus export/import of a slot's prefill and the compaction after a tree.

Invariant: layer i's cache of a slot holds `slot_lengths[slot][i]` positions."""

from __future__ import annotations

import torch

from specpilot.models.synced_cache import CachedTokens


class DecoderCache:
    """Cache half of `DecoderRunner`; needs the model's shape attributes set before
    `_allocate_cache`."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_length: int
    dtype: torch.dtype
    device: torch.device

    def _allocate_cache(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        shape = (self.num_layers, batch_size, self.num_kv_heads, self.max_length, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.slot_lengths = [[0] * self.num_layers for _ in range(batch_size)]
        self.cached = CachedTokens(batch_size)

    @property
    def lengths(self) -> list[int]:
        """Per-layer cached lengths of slot 0 (the single-sequence API)."""
        return self.slot_lengths[0]

    @property
    def length(self) -> int:
        return self.lengths[-1]

    def rollback(self, length: int, layers: range | None = None, slot: int = 0) -> None:
        lengths = self.slot_lengths[slot]
        for i in layers if layers is not None else range(self.num_layers):
            lengths[i] = min(lengths[i], length)
        self.cached.trim(slot, length)

    def reset(self) -> None:
        self.slot_lengths = [[0] * self.num_layers for _ in range(self.batch_size)]
        self.cached.clear()

    def cache_state(self, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of `slot`'s keys and values at positions [0, length) (each [layers, kv heads,
        length, head dim]): a prefill kept to be restored later with `load_cache_state`."""
        if min(self.slot_lengths[slot]) < length:
            raise ValueError(
                f"slot {slot} holds {min(self.slot_lengths[slot])} < {length} positions"
            )
        return (
            self.k_cache[:, slot, :, :length].clone(),
            self.v_cache[:, slot, :, :length].clone(),
        )

    def load_cache_state(self, slot: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Make `slot` hold the positions of a `cache_state` (of this model and dtype)."""
        expected = (self.num_layers, self.num_kv_heads, keys.shape[2], self.head_dim)
        if keys.shape != expected or values.shape != expected or keys.shape[2] > self.max_length:
            raise ValueError(
                f"a cache state of shape {tuple(keys.shape)} does not fit this model's cache "
                f"(layers, kv heads, positions <= {self.max_length}, head dim) = {expected}"
            )
        length = keys.shape[2]
        self.k_cache[:, slot, :, :length] = keys.to(self.k_cache)
        self.v_cache[:, slot, :, :length] = values.to(self.v_cache)
        self.slot_lengths[slot] = [length] * self.num_layers
        self.cached.trim(slot, 0)

    def keep_path(self, slot: int, start: int, path: tuple[int, ...]) -> None:
        """After a tree fed from cache position `start` (its root): move the keys/values of the
        accepted nodes `path` (node i sits at start + 1 + i) to start + 1, start + 2, ..., where
        a chain would have put them. The caller then rolls back to the committed length."""
        if list(path) == list(range(len(path))):
            return  # the chain's own positions already
        source = torch.tensor([start + 1 + i for i in path], device=self.device)
        target = torch.arange(start + 1, start + 1 + len(path), device=self.device)
        for cache in (self.k_cache, self.v_cache):
            cache[:, slot, :, target] = cache[:, slot, :, source]
