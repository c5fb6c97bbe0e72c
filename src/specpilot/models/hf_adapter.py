"""Generic transformers backend for architectures the lean decoder does not cover.

Uses the model's own forward with a DynamicCache; rollback crops the cache. It offers the
`CausalRunner` interface only: no layer taps, layer-split forwards or tree masks, so methods that
need those (DVI, tree drafting) reject models served by this adapter with a clear error.

Rollback: `DynamicCache.crop` takes the absolute length to keep in transformers 4.x but only a
negative count of tokens to drop in 5.x; a negative count means the same in both. Sliding-window
layers normally keep only the last window, which a rollback would need to restore: the cache
records past states (transformers 5) and trims them at each crop, so a rollback may go back to
the length of the last crop but not further (`cached.floors`, so prefix reuse starts over
rather than go below it). Full-attention caches roll back anywhere; recurrent-state layers
(linear attention, SSMs) cannot roll back at all: their floor is always the current length.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from specpilot.config import GenerationConfig
from specpilot.errors import ConfigError, PromptError
from specpilot.models.runner import LogitRows
from specpilot.models.synced_cache import CachedTokens


class HFRunner:
    backend = "hf"
    batch_size = 1
    """One cache slot: batched decoding needs the lean decoder backend."""

    def __init__(self, hf_model, max_length: int | None = None):
        self.model = hf_model.eval()
        config = hf_model.config
        limit = getattr(config, "max_position_embeddings", None) or max_length or 2048
        self.max_length = min(limit, max_length) if max_length else limit
        self.vocab_size = hf_model.get_output_embeddings().weight.shape[0]
        self.dtype = hf_model.dtype
        self.device = hf_model.device
        self.cached = CachedTokens(1)
        self.reset()

    @property
    def length(self) -> int:
        return self._length

    def rollback(self, length: int, slot: int = 0) -> None:
        if length >= self._length:
            return
        if length == 0:
            self.reset()
            return
        if not self._croppable():
            raise ConfigError(
                f"{type(self.model).__name__} keeps a recurrent state that cannot be rolled back, "
                "so speculative decoding cannot serve it: decode without a drafter"
            )
        floors = self.cached.floors
        if length < floors[0]:
            raise RuntimeError(
                f"cannot roll back to {length}: windowed layers keep positions from "
                f"{floors[0]} on (module docstring)"
            )
        self.cache.crop(length - self._length)
        self._length = length
        self.cached.trim(0, length)
        if not all(type(layer) is DynamicLayer for layer in self.cache.layers):
            floors[0] = length

    def _croppable(self) -> bool:
        return all(getattr(layer, "is_croppable", True) for layer in self.cache.layers)

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        if hasattr(self.cache, "activate_past_recording"):  # transformers 5: windows can crop
            self.cache.activate_past_recording()
        self._length = 0
        self.cached.clear()

    @torch.inference_mode()
    def forward(self, input_ids: list[int], logits: LogitRows = "all") -> torch.Tensor | None:
        n = len(input_ids)
        if self._length + n > self.max_length:
            raise PromptError(
                f"sequence of {self._length + n} tokens exceeds the context of {self.max_length}; "
                "use a shorter prompt or fewer new tokens"
            )
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        positions = torch.arange(self._length, self._length + n, device=self.device)
        keep = {"all": 0, "last": 1, "none": 1}[logits]
        out = self.model(
            input_ids=ids,
            past_key_values=self.cache,
            use_cache=True,
            cache_position=positions,
            logits_to_keep=keep,
        )
        self.cache = out.past_key_values
        self._length += n
        if not self._croppable():
            self.cached.floors[0] = self._length
        return None if logits == "none" else out.logits[0].float()

    def forward_batch(
        self, rows: list[list[int]], slots: list[int], logits: LogitRows = "all", head=None
    ) -> list[torch.Tensor | None]:
        """The batch interface for a batch of one (see DecoderRunner.forward_batch)."""
        if len(rows) != 1 or slots != [0] or head is not None:
            raise ConfigError(
                "the transformers backend decodes one sequence at a time with the full vocabulary; "
                "batches and reduced draft vocabularies need the lean decoder (Llama/Qwen2 family)"
            )
        return [self.forward(rows[0], logits) if rows[0] else None]


def generate_options(config: GenerationConfig, eos_ids) -> dict:
    """transformers `generate`'s arguments for `config`'s length and sampling (stop strings
    excepted), so its answers follow the same rules as the engine's: top_k 0 and top_p 1 keep
    every token (None would let generate fill in its own defaults, e.g. top_k 50)."""
    eos = sorted(eos_ids)
    options = dict(
        max_new_tokens=config.max_new_tokens, eos_token_id=eos, pad_token_id=eos[0] if eos else None
    )
    sampling = config.sampling
    if sampling.greedy:
        return {**options, "do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {
        **options,
        "do_sample": True,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
    }
