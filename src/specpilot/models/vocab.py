"""A reduced draft vocabulary: the draft scores only a subset of token ids.

With 150k-token vocabularies the LM head is a quarter of a 0.5B draft's weights, and drafting is
memory-bound, so scoring a 32k subset makes each draft step markedly cheaper. It stays lossless:
the draft proposes from (and, when sampling, reports probabilities over) the subset, zero
elsewhere, and the target verifies as usual; only the acceptance rate can suffer when the target
wants a token outside the subset.

Which ids: byte-level BPE vocabularies are ordered by merge rank, a good proxy for frequency, so
the first N ids (plus every special token, which end turns) are the subset by default.
"""

from __future__ import annotations

import torch

from specpilot.config import require


class DraftVocabulary:
    def __init__(self, token_ids: torch.Tensor, full_size: int):
        ids = torch.unique(token_ids.long())
        require(
            len(ids) > 0 and int(ids[-1]) < full_size,
            "draft vocabulary ids must lie in the model's vocabulary",
        )
        self.token_ids = ids  # [subset], sorted
        self.full_size = full_size
        self._ids_list = ids.tolist()

    @classmethod
    def first_ids(cls, size: int, tokenizer, full_size: int) -> DraftVocabulary:
        """The `size` lowest ids plus all special tokens."""
        require(size >= 1, f"draft vocabulary size must be >= 1, got {size}")
        special = [
            i for i in getattr(tokenizer, "all_special_ids", []) if i is not None and i < full_size
        ]
        added = [i for i in getattr(tokenizer, "added_tokens_decoder", {}) if i < full_size]
        ids = torch.cat(
            [torch.arange(min(size, full_size)), torch.tensor(special + added, dtype=torch.long)]
        )
        return cls(ids, full_size)

    def __len__(self) -> int:
        return len(self._ids_list)

    def head(self, lm_head: torch.Tensor) -> torch.Tensor:
        """Rows of the LM head for the subset, contiguous so they stream fast."""
        return lm_head[self.token_ids.to(lm_head.device)].contiguous()

    def to_full_id(self, index: int) -> int:
        return self._ids_list[index]

    def to_full_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """[subset] probabilities → [full_size], zero outside the subset."""
        full = torch.zeros(self.full_size, dtype=probs.dtype)
        return full.index_copy_(0, self.token_ids, probs)
