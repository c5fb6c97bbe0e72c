"""A reduced draft vocabulary: the draft scores only a subset of token ids.

With 150k-token vocabularies the LM head is a quarter of a 0.5B draft's weights, and drafting is
memory-bound, so scoring a 32k subset makes each draft step markedly cheaper. It stays lossless:
the draft proposes from (and, when sampling, reports probabilities over) the subset, zero
elsewhere, and the target verifies as usual; only the acceptance rate can suffer when the target
wants a token outside the subset.

Which ids: the N most frequent tokens of a corpus (`from_corpus`), or, without one, the first N
ids: byte-level BPE vocabularies are ordered by merge rank, a rough proxy for frequency. Every
special token (they end turns) is always in the subset.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specpilot.config import require
from specpilot.errors import ConfigError
from specpilot.prompts import read_jsonl


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
        return cls._with_specials(torch.arange(min(size, full_size)), tokenizer, full_size)

    @classmethod
    def from_corpus(
        cls, size: int, tokenizer, full_size: int, corpus: str | Path
    ) -> DraftVocabulary:
        """The `size` ids most frequent in `corpus` (ties: lower id first) plus all special
        tokens. Ids the corpus never uses fill up the subset in id order, so it always has
        `size` ordinary ids."""
        require(size >= 1, f"draft vocabulary size must be >= 1, got {size}")
        texts = corpus_texts(corpus)
        require(bool(texts), f"draft vocabulary corpus {str(corpus)!r} holds no text")
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([i for text_ids in encoded for i in text_ids], dtype=torch.long)
        counts = torch.bincount(ids[ids < full_size], minlength=full_size)
        # A stable sort on −count keeps id order among equal counts.
        order = torch.sort(-counts, stable=True).indices
        return cls._with_specials(order[: min(size, full_size)], tokenizer, full_size)

    @classmethod
    def _with_specials(cls, ids: torch.Tensor, tokenizer, full_size: int) -> DraftVocabulary:
        special = [
            i for i in getattr(tokenizer, "all_special_ids", []) if i is not None and i < full_size
        ]
        added = [i for i in getattr(tokenizer, "added_tokens_decoder", {}) if i < full_size]
        return cls(torch.cat([ids, torch.tensor(special + added, dtype=torch.long)]), full_size)

    @classmethod
    def select(
        cls, size: int, tokenizer, full_size: int, corpus: str | Path | None = None
    ) -> DraftVocabulary:
        """From `corpus` if one is given, else the first ids."""
        if corpus:
            return cls.from_corpus(size, tokenizer, full_size, corpus)
        return cls.first_ids(size, tokenizer, full_size)

    def __len__(self) -> int:
        return len(self._ids_list)

    def head(self, lm_head: torch.Tensor) -> torch.Tensor:
        """Rows of the LM head for the subset, contiguous so they stream fast."""
        return lm_head[self.token_ids.to(lm_head.device)].contiguous()

    def to_full_id(self, index: int) -> int:
        return self._ids_list[index]

    def to_full_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """[subset] probabilities → [full_size], zero outside the subset."""
        full = torch.zeros(self.full_size, dtype=probs.dtype, device=probs.device)
        return full.index_copy_(0, self.token_ids.to(probs.device), probs)


def corpus_texts(path: str | Path) -> list[str]:
    """The text of a corpus file: for JSONL every string value of every object (ShareGPT
    conversations, prompt and answer fields alike), for any other file its whole text."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"draft vocabulary corpus not found: {path}")
    if path.suffix != ".jsonl":
        text = path.read_text(encoding="utf-8", errors="replace")
        chunk = 1 << 20  # tokenizers are slow on one huge string
        return [text[i : i + chunk] for i in range(0, len(text), chunk)]
    texts: list[str] = []

    def collect(value) -> None:
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, dict | list):
            for item in value.values() if isinstance(value, dict) else value:
                collect(item)

    collect(read_jsonl(path))
    return texts
