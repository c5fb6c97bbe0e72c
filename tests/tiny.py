"""Tiny random models and tokenizers built in the test process (no downloads).

SPECPILOT_TEST_DEVICE=cuda builds every tiny model on the GPU, so the lossless suite runs there
unchanged (a GPU check of the whole engine, not only the tests marked `cuda`).
"""

from __future__ import annotations

import os

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

TEST_DEVICE = torch.device(os.environ.get("SPECPILOT_TEST_DEVICE", "cpu"))
cpu_training = pytest.mark.skipif(
    TEST_DEVICE.type != "cpu", reason="train-eagle and train-ppow train beside a CPU target"
)


def tiny_model(
    kind: str = "qwen2",
    vocab_size: int = 96,
    seed: int = 0,
    dtype=torch.float32,
    num_layers: int = 4,
    tie: bool = False,
):
    """A randomly initialised 4-layer Llama or Qwen2 model (GQA, with q/k/v bias for Qwen2)."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, rope_theta=10000.0))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common, rope_theta=500000.0))
    # Larger-than-init weights make logits spread out, so argmax ties are unlikely.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model.to(TEST_DEVICE, dtype).eval()


def tiny_generic(kind: str = "gpt2", vocab_size: int = 96, seed: int = 0):
    """A random float32 model the lean decoder does not serve (the transformers backend does):
    GPT-2 (learned positions, fused qkv), or Gemma 3 with sliding-window layers of window 4
    alternating with full-attention ones, so any test past 4 tokens crops windowed caches."""
    torch.manual_seed(seed)
    ids = dict(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "gpt2":
        config = GPT2Config(**ids, n_positions=256, n_embd=64, n_layer=2, n_head=4)
        model = GPT2LMHeadModel(config)
    else:
        config = Gemma3TextConfig(
            **ids,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"] * 2,
        )
        model = Gemma3ForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model.to(TEST_DEVICE).eval()


class TinyTokenizer:
    """Just enough tokenizer for the engine: ids print as 't<id>' words; 2 is EOS."""

    eos_token_id = 2

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(f" t{i}" for i in ids if not (skip_special_tokens and i == 2))


def seeded_noise(p: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Standard Gaussian noise shaped like `p`, drawn from a CPU generator (the same numbers on
    every device) and moved to `p`'s device."""
    return torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device)


def perturbed(model, scale: float, seed: int = 123):
    """`model` with Gaussian noise on every weight: a draft that agrees often, not always."""
    import copy

    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(seeded_noise(p, generator) * scale * p.std())
    return draft


SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3, matching tiny_model's pad/bos/eos ids


def tiny_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """A whitespace WordLevel tokenizer: specials first, then `words`."""
    vocab = {token: i for i, token in enumerate(SPECIALS + words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )


def save_tiny(folder, kind="qwen2", words=None, seed=0):
    """A tiny random model plus tokenizer saved as a loadable folder."""
    words = words if words is not None else [f"w{i}" for i in range(4, 96)]
    vocab_size = len(SPECIALS) + len(words)
    tiny_model(kind, vocab_size=vocab_size, seed=seed).save_pretrained(folder)
    tiny_tokenizer(words).save_pretrained(folder)
    return folder
