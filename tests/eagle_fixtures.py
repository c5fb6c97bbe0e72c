"""A tiny target with a feature-drafter head, for the eagle tests."""

from __future__ import annotations

import torch
from tiny import seeded_noise, tiny_model, tiny_tokenizer

from specpilot.drafting.eagle_head import EagleHead, EagleShape
from specpilot.models.decoder import DecoderRunner

WORDS = [f"w{i}" for i in range(4, 96)]


def tiny_target(dtype=torch.float64, seed: int = 0, vocab_size: int = 96):
    return tiny_model("qwen2", vocab_size=vocab_size, seed=seed, dtype=dtype)


def tiny_head(runner: DecoderRunner, draft_vocab: int | None = None, noise: float = 0.02, seed=0):
    """A head started from the target's top (as train-eagle does) plus noise: it agrees with the
    target often but not always, so drafts are partly accepted."""
    tokenizer = tiny_tokenizer(WORDS[: runner.vocab_size - 4])
    shape = EagleShape.for_target(runner, tokenizer, draft_vocab_size=draft_vocab)
    ids = torch.arange(runner.vocab_size)[: shape.draft_vocab_size]
    head = EagleHead(shape, ids)
    head.init_from_target(runner)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(seeded_noise(p, generator) * noise * (p.std() + 1e-3))
    return head.double() if runner.dtype == torch.float64 else head


class TinyLoaded:
    """The tiny target as the head trainers take it (a LoadedModel's runner, tokenizer, name)."""

    def __init__(self, model, max_length: int = 160):
        self.runner = DecoderRunner(model, max_length=max_length)
        self.tokenizer = tiny_tokenizer(WORDS)
        self.name = "tiny"
