"""Monte-Carlo check of sampled speculative decoding on the real engine path (docs/methods.md §6,
kind 3).

The joint distribution of the first two generated tokens, over many seeds, must match the
target's exact distribution (computed from its logits) by a chi-square test — for a model
drafter (stochastic proposals) and the n-gram drafter (deterministic proposals), with plain
temperature and with top-k/top-p, on the lean decoder and on the generic transformers backend.
A deliberately broken verifier (accept every draft token) run through the same test must be
rejected, so the test can fail.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare
from tiny import TinyTokenizer, perturbed, tiny_generic, tiny_model

import specpilot.engine.speculative as speculative
from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.drafting import ModelDrafter, NgramDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.models.decoder import DecoderRunner
from specpilot.models.hf_adapter import HFRunner
from specpilot.models.vocab import DraftVocabulary
from specpilot.policies import ConstantPolicy, SvipPolicy
from specpilot.sampling import logits_to_probs, sample
from specpilot.types import VerifyResult

VOCAB = 8
PROMPT = [1, 3, 4, 5, 3, 4]  # repeats, so the n-gram drafter proposes something
TRIALS = 2000


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=3)


def exact_joint_distribution(model, sampling: SamplingConfig, length: int = 2) -> torch.Tensor:
    """[VOCAB ** length] probabilities of the first `length` generated tokens, target alone."""

    def next_probs(prefix: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(torch.tensor([prefix], device=model.device)).logits[0, -1]
            return logits_to_probs(logits.double().cpu(), sampling)

    joint = torch.ones(1, dtype=torch.float64)
    prefixes = [list(PROMPT)]
    for _ in range(length):
        joint = torch.cat([joint[i] * next_probs(p) for i, p in enumerate(prefixes)])
        prefixes = [p + [t] for p in prefixes for t in range(VOCAB)]
    return joint


def chi_square_pvalue(
    engine: SpeculativeEngine, expected: torch.Tensor, sampling, length: int = 2
) -> float:
    counts = torch.zeros(VOCAB**length)
    for seed in range(TRIALS):
        tokens = engine.generate(
            PROMPT, GenerationConfig(max_new_tokens=length, sampling=sampling, seed=seed)
        ).token_ids
        counts[sum(t * VOCAB ** (length - 1 - i) for i, t in enumerate(tokens))] += 1
    expected_counts = expected * TRIALS
    keep = expected_counts >= 5  # pool rare cells so the chi-square approximation holds
    observed = torch.cat([counts[keep], counts[~keep].sum().reshape(1)])
    wanted = torch.cat([expected_counts[keep], expected_counts[~keep].sum().reshape(1)])
    if wanted[-1] == 0:
        observed, wanted = observed[:-1], wanted[:-1]
    return float(
        chisquare(
            observed.numpy(), wanted.numpy() * observed.sum().item() / wanted.sum().item()
        ).pvalue
    )


def make_engine(target, drafter_kind: str, policy=None, runner=DecoderRunner) -> SpeculativeEngine:
    if drafter_kind == "ngram":
        drafter = NgramDrafter()
    else:  # "model-subvocab" drafts from ids 0..5 only: q is zero on ids 6 and 7
        vocabulary = (
            DraftVocabulary(torch.arange(6), VOCAB) if drafter_kind == "model-subvocab" else None
        )
        drafter = ModelDrafter(runner(perturbed(target, 1.0)), vocabulary)
    return SpeculativeEngine(
        runner(target), TinyTokenizer(), drafter, policy or ConstantPolicy(2), eos_ids=set()
    )


SAMPLINGS = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=5, top_p=0.9)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t0.8-topk-topp"])
@pytest.mark.parametrize("drafter_kind", ["model", "model-subvocab", "ngram"])
def test_sampled_output_follows_target(target, drafter_kind, sampling):
    expected = exact_joint_distribution(target, sampling)
    assert chi_square_pvalue(make_engine(target, drafter_kind), expected, sampling) > 1e-3


@pytest.mark.parametrize("kind,drafter_kind", [("gpt2", "ngram"), ("gemma3", "model")])
def test_hf_backend_sampled_output_follows_target(kind, drafter_kind):
    """The transformers backend (HFRunner): rejected drafts crop its DynamicCache, windowed
    layers included (Gemma 3's window of 4 is shorter than the prompt)."""
    sampling = SAMPLINGS[1]
    target = tiny_generic(kind, vocab_size=VOCAB, seed=3)
    engine = make_engine(target, drafter_kind, runner=HFRunner)
    assert chi_square_pvalue(engine, exact_joint_distribution(target, sampling), sampling) > 1e-3


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t0.8-topk-topp"])
def test_svip_sampled_output_follows_target(target, sampling):
    """Three tokens, so SVIP's entropy stop (limit 1.18 nats; this draft's entropies are 0.6-1.8)
    decides between drafting one and two tokens: a data-dependent draft length stays lossless."""
    expected = exact_joint_distribution(target, sampling, length=3)
    engine = make_engine(target, "model", SvipPolicy(h=0.42))
    assert chi_square_pvalue(engine, expected, sampling, length=3) > 1e-3


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t0.8-topk-topp"])
def test_svip_stop_before_sampled_output_follows_target(target, sampling):
    """SVIP stopping before an uncertain token: steps draft zero, one or two tokens."""
    expected = exact_joint_distribution(target, sampling, length=3)
    engine = make_engine(target, "model", SvipPolicy(h=0.42, keep_uncertain=False))
    assert chi_square_pvalue(engine, expected, sampling, length=3) > 1e-3


def accept_everything(draft_tokens, draft_probs, target_logits, sampling, generator):
    """Broken on purpose: skips the acceptance test, so the output follows the draft."""
    probs = logits_to_probs(target_logits, sampling)
    return VerifyResult(len(draft_tokens), sample(probs[len(draft_tokens)], generator))


def test_broken_verifier_is_detected(target, monkeypatch):
    sampling = SAMPLINGS[0]
    expected = exact_joint_distribution(target, sampling)
    monkeypatch.setattr(speculative, "verify", accept_everything)
    assert chi_square_pvalue(make_engine(target, "model"), expected, sampling) < 1e-6
