"""Greedy identity (docs/methods.md §6, kind 4) and KV-cache rollback (kind 5) on the real engine.

Every drafter × policy must reproduce plain greedy decoding token for token, including scripted
drafters that are right for exactly j tokens and then wrong, EOS inside a draft, and
max_new_tokens reached in the middle of a draft.
"""

from __future__ import annotations

import pytest
import torch
from tiny import TinyTokenizer, perturbed, tiny_model

from specpilot.config import GenerationConfig
from specpilot.drafting import ModelDrafter, NgramDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.models.decoder import DecoderRunner
from specpilot.models.vocab import DraftVocabulary
from specpilot.policies import ConstantPolicy, HeuristicPolicy, SvipPolicy
from specpilot.types import Proposal

PROMPTS = [[1, 5, 9, 14], [1, 30, 31, 30, 31, 30], [1, 7], [1, 60, 2, 61, 62, 63, 64, 65]]
MAX_NEW = 24


@pytest.fixture(scope="module")
def target_model():
    return tiny_model("qwen2", seed=0)


@pytest.fixture(scope="module")
def reference(target_model):
    """Plain greedy continuations (no EOS stop, so they are long enough to script drafters)."""
    engine = SpeculativeEngine(DecoderRunner(target_model), TinyTokenizer(), eos_ids=set())
    return {
        tuple(p): engine.generate(p, GenerationConfig(max_new_tokens=MAX_NEW + 8)).token_ids
        for p in PROMPTS
    }


class ScriptedDrafter:
    """Proposes the true greedy continuation for `right` tokens, then wrong tokens."""

    def __init__(self, prompt: list[int], continuation: list[int], right: int, vocab: int = 96):
        self.full = prompt + continuation
        self.right, self.vocab = right, vocab

    def reset(self) -> None:
        pass

    def propose(self, sequences, slots, budgets, policies, samplings, generators):
        (sequence,), (budget,) = sequences, budgets
        assert sequence == self.full[: len(sequence)], (
            "engine committed a token plain decoding would not"
        )
        truth = self.full[len(sequence) : len(sequence) + budget]
        tokens = [t if i < self.right else (t + 1) % self.vocab for i, t in enumerate(truth)]
        return [Proposal(tokens)]


def policies():
    # SVIP with h = 0.72 stops above 3.46 nats: the tiny draft's entropies (3.2-3.7) make it
    # stop after one token at some positions and draft on at others.
    return [
        ConstantPolicy(1),
        ConstantPolicy(3),
        ConstantPolicy(5),
        HeuristicPolicy(),
        SvipPolicy(h=0.72, max_k=6),
    ]


def make_drafter(kind: str, target_model):
    if kind == "ngram":
        return NgramDrafter()
    vocabulary = DraftVocabulary(torch.arange(48), 96) if kind == "model-subvocab" else None
    return ModelDrafter(DecoderRunner(perturbed(target_model, 0.3)), vocabulary)


@pytest.mark.parametrize("policy", policies(), ids=lambda p: repr(p))
@pytest.mark.parametrize("drafter_kind", ["model", "model-subvocab", "ngram"])
def test_drafters_match_plain_greedy(target_model, reference, policy, drafter_kind):
    drafter = make_drafter(drafter_kind, target_model)
    engine = SpeculativeEngine(
        DecoderRunner(target_model), TinyTokenizer(), drafter, policy, eos_ids=set()
    )
    accepted = 0
    for prompt in PROMPTS:
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
        assert result.token_ids == reference[tuple(prompt)][:MAX_NEW]
        assert result.finish_reason == "length"
        accepted += result.stats.accepted
    if drafter_kind.startswith("model"):
        assert accepted > 0, "the perturbed draft should get some tokens accepted"


@pytest.mark.parametrize("right", range(0, 6))
@pytest.mark.parametrize("k", [1, 3, 5])
def test_scripted_partial_acceptance(target_model, reference, right, k):
    prompt = PROMPTS[0]
    drafter = ScriptedDrafter(prompt, reference[tuple(prompt)], right)
    engine = SpeculativeEngine(
        DecoderRunner(target_model), TinyTokenizer(), drafter, ConstantPolicy(k), eos_ids=set()
    )
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
    assert result.token_ids == reference[tuple(prompt)][:MAX_NEW]
    expected_accepted = min(right, k)
    assert all(
        r.num_accepted == min(expected_accepted, r.num_drafted) for r in result.stats.records
    )


@pytest.mark.parametrize("k", [2, 5])
def test_eos_inside_a_draft(target_model, reference, k):
    prompt = PROMPTS[1]
    continuation = reference[tuple(prompt)]
    eos = continuation[6]  # declare a token that plain decoding emits at index 6 to be EOS
    plain = SpeculativeEngine(DecoderRunner(target_model), TinyTokenizer(), eos_ids={eos})
    expected = plain.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
    assert expected.finish_reason == "eos" and expected.token_ids[-1] == eos
    drafter = ScriptedDrafter(prompt, continuation, right=99)  # always right: EOS lands mid-draft
    engine = SpeculativeEngine(
        DecoderRunner(target_model), TinyTokenizer(), drafter, ConstantPolicy(k), eos_ids={eos}
    )
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
    assert result.token_ids == expected.token_ids
    assert result.finish_reason == "eos"


@pytest.mark.parametrize("max_new", [1, 2, 6, 7, 11])
def test_max_length_mid_draft(target_model, reference, max_new):
    prompt = PROMPTS[0]
    drafter = ScriptedDrafter(prompt, reference[tuple(prompt)], right=99)
    engine = SpeculativeEngine(
        DecoderRunner(target_model), TinyTokenizer(), drafter, ConstantPolicy(5), eos_ids=set()
    )
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=max_new))
    assert result.token_ids == reference[tuple(prompt)][:max_new]
    assert result.stats.new_tokens == max_new


def test_stop_string_cuts_text(target_model, reference):
    prompt = PROMPTS[0]
    continuation = reference[tuple(prompt)]
    stop = f" t{continuation[4]}"
    engine = SpeculativeEngine(
        DecoderRunner(target_model), TinyTokenizer(), NgramDrafter(), eos_ids=set()
    )
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW, stop_strings=(stop,)))
    first = next(i for i, t in enumerate(continuation) if f" t{t}" == stop)
    assert result.finish_reason == "stop"
    assert result.token_ids == continuation[: first + 1]
    assert stop not in result.text


def test_cache_after_generation_equals_fresh_prefill(target_model, reference):
    """After commit the target cache holds len(sequence) − 1 positions, equal to a fresh prefill."""
    prompt = PROMPTS[3]
    runner = DecoderRunner(target_model)
    drafter = ModelDrafter(DecoderRunner(perturbed(target_model, 0.3)))
    engine = SpeculativeEngine(runner, TinyTokenizer(), drafter, ConstantPolicy(4), eos_ids=set())
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
    sequence = prompt + result.token_ids
    assert runner.length == len(sequence) - 1
    fresh = DecoderRunner(target_model)
    fresh.forward(sequence[:-1], logits="none")
    n = len(sequence) - 1
    torch.testing.assert_close(
        runner.k_cache[:, 0, :, :n], fresh.k_cache[:, 0, :, :n], rtol=1e-4, atol=1e-5
    )
    torch.testing.assert_close(
        runner.v_cache[:, 0, :, :n], fresh.v_cache[:, 0, :, :n], rtol=1e-4, atol=1e-5
    )
    assert drafter.runner.length == len(drafter.runner.cached.slots[0])
