"""Speculative decoding on the generic transformers backend (HFRunner): every rejected draft
crops the DynamicCache, so greedy output must equal the model's own greedy decoding token for
token, with a draft model and with n-gram lookup, on a full-attention model (GPT-2) and on one
with sliding-window layers (Gemma 3, window 4), whose windowed caches must roll back too.
The sampled distribution on this backend is checked in test_engine_sampling.py."""

from __future__ import annotations

import pytest
import torch
from tiny import TinyTokenizer, perturbed, tiny_generic

from specpilot.config import GenerationConfig
from specpilot.drafting import ModelDrafter, NgramDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.models.hf_adapter import HFRunner
from specpilot.policies import ConstantPolicy, HeuristicPolicy

PROMPTS = [[1, 5, 9, 14], [1, 30, 31, 30, 31, 30], [1, 60, 2, 61, 62, 63, 64, 65]]
MAX_NEW = 20


@pytest.fixture(scope="module", params=["gpt2", "gemma3"])
def model(request):
    return tiny_generic(request.param)


def greedy_without_cache(model, prompt: list[int], n: int) -> list[int]:
    """The model's greedy continuation, each token from a full forward (no cache to get wrong)."""
    sequence = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([sequence], device=model.device)).logits[0, -1]
            sequence.append(int(logits.argmax()))
    return sequence[len(prompt) :]


@pytest.mark.parametrize("policy", [ConstantPolicy(3), HeuristicPolicy()], ids=["k3", "heuristic"])
@pytest.mark.parametrize("drafter_kind", ["model", "ngram"])
def test_hf_backend_speculative_matches_greedy(model, drafter_kind, policy):
    drafter = (
        NgramDrafter() if drafter_kind == "ngram" else ModelDrafter(HFRunner(perturbed(model, 0.3)))
    )
    engine = SpeculativeEngine(HFRunner(model), TinyTokenizer(), drafter, policy, eos_ids=set())
    rejected = 0
    for prompt in PROMPTS:
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
        assert result.token_ids == greedy_without_cache(model, prompt, MAX_NEW)
        rejected += sum(r.num_accepted < r.num_drafted for r in result.stats.records)
    assert rejected > 0, "some drafts must be rejected, or no rollback was tested"
