"""SVIP's stopping rule (docs/methods.md §5): stop after a token whose draft entropy H satisfies
sqrt(c·H) > h; the token is kept; at least one token, at most max_k."""

from __future__ import annotations

import math

import pytest
import torch

from specpilot.config import SamplingConfig
from specpilot.drafting import ModelDrafter
from specpilot.errors import ConfigError
from specpilot.methods import make_policy
from specpilot.models.decoder import DecoderRunner
from specpilot.models.synced_cache import CachedTokens
from specpilot.policies import DraftToken, SvipPolicy


def logits_with_entropy(target: float, vocab: int = 50) -> torch.Tensor:
    """Logits whose softmax has entropy `target` nats (bisection on a two-level distribution)."""
    low, high = 0.0, 50.0
    for _ in range(100):
        gap = (low + high) / 2
        logits = torch.zeros(vocab, dtype=torch.float64)
        logits[0] = gap
        p = logits.softmax(-1)
        h = float(-(p * p.log()).sum())
        low, high = (gap, high) if h > target else (low, gap)
    return logits


def test_default_threshold_is_0_6_nats():
    policy = SvipPolicy()
    assert policy.entropy_limit == pytest.approx(0.6)
    assert policy.draft_budget() == 40
    assert policy.continue_drafting(DraftToken(0, 1, logits_with_entropy(0.59)))
    assert not policy.continue_drafting(DraftToken(0, 1, logits_with_entropy(0.61)))


def test_rule_is_sqrt_c_h_greater_than_h():
    policy = SvipPolicy(c=0.18, h=0.4)
    for entropy in (0.2, 0.8, 0.88, 0.9, 1.5):
        keep_going = math.sqrt(0.18 * entropy) <= 0.4
        assert (
            policy.continue_drafting(DraftToken(0, 1, logits_with_entropy(entropy))) is keep_going
        )


def test_model_free_drafts_continue():
    assert SvipPolicy().continue_drafting(DraftToken(0, 1, None))


class ScriptedRunner:
    """A draft 'model' whose next-token entropy follows a script (token ids = position)."""

    vocab_size = 50
    batch_size = 1

    def __init__(self, entropies: list[float]):
        self.entropies = entropies
        self.length = 0
        self.cached = CachedTokens(1)

    def reset(self):
        self.length = 0
        self.cached.clear()

    def rollback(self, length, layers=None, slot=0):
        self.length = min(self.length, length)
        self.cached.trim(slot, length)

    def forward(self, ids, logits="all"):
        self.length += len(ids)
        out = logits_with_entropy(self.entropies[self.length % len(self.entropies)]).float()
        return out[None]

    def forward_batch(self, rows, slots, logits="all", head=None):
        return [self.forward(rows[0], logits)]


def propose_one(drafter: ModelDrafter, sequence: list[int], budget: int, policy: SvipPolicy):
    """A batch of one in cache slot 0, greedy."""
    return drafter.propose([sequence], [0], [budget], [policy], [SamplingConfig()], [None])[0]


def test_keep_then_stop_and_at_least_one_token():
    # entropies seen at draft steps: low, low, high → three tokens drafted, the high one kept
    drafter = ModelDrafter(ScriptedRunner([0.1] * 4 + [2.0] + [0.1] * 10))  # cache length → H
    proposal = propose_one(drafter, [1, 2], 40, SvipPolicy())
    assert proposal.k == 3
    drafter = ModelDrafter(ScriptedRunner([3.0]))  # hopeless from the start: still one token
    assert propose_one(drafter, [1, 2], 40, SvipPolicy()).k == 1
    drafter = ModelDrafter(ScriptedRunner([0.0]))  # confident forever: capped by max_k
    policy = SvipPolicy(max_k=7)
    assert propose_one(drafter, [1, 2], policy.draft_budget(), policy).k == 7


def test_stop_before_the_uncertain_token_may_draft_nothing():
    # keep_uncertain=False: the high-entropy third position is not drafted at all
    drafter = ModelDrafter(ScriptedRunner([0.1] * 4 + [2.0] + [0.1] * 10))
    policy = SvipPolicy(keep_uncertain=False)
    assert propose_one(drafter, [1, 2], 40, policy).k == 2
    drafter = ModelDrafter(ScriptedRunner([3.0]))  # hopeless from the start: nothing drafted
    assert propose_one(drafter, [1, 2], 40, policy).k == 0
    assert make_policy("svip", keep_uncertain="0").draft_policy.keep_uncertain is False


@pytest.mark.parametrize("options", [{"c": "0"}, {"h": "-1"}, {"max_k": "0"}, {"max_k": "65"}])
def test_bad_options_are_config_errors(options):
    with pytest.raises(ConfigError):
        make_policy("svip", **options)


def test_registry_builds_svip_from_strings():
    policy = make_policy("svip", c="0.2", h="0.5", max_k="12").draft_policy
    assert (policy.c, policy.h, policy.max_k) == (0.2, 0.5, 12)


def test_svip_on_a_real_runner_drafts_variable_lengths():
    from tiny import perturbed, tiny_model

    draft = DecoderRunner(perturbed(tiny_model("qwen2", seed=0), 0.3))
    drafter = ModelDrafter(draft)
    lengths = {
        propose_one(drafter, list(range(1, n)), 6, SvipPolicy(h=0.72)).k for n in range(3, 15)
    }
    assert len(lengths) > 1
