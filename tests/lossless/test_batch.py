"""Batched decoding (docs/methods.md §6, kinds 4-5 per row): rows of different lengths decoded
together, each accepting its own number of tokens per step and finishing at its own time, must
each equal decoding of that row alone — greedy token for token, and under sampling the same
tokens for the same seed (every row has its own generator, so batchmates cannot change its
draws; SV's cross-row allocation is the exception, tested in test_sv.py)."""

from __future__ import annotations

import pytest
import torch
from tiny import TinyTokenizer, perturbed, tiny_model

from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.drafting import ModelDrafter, NgramDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.errors import ConfigError
from specpilot.models.decoder import DecoderRunner
from specpilot.models.synced_cache import common_prefix_length
from specpilot.models.vocab import DraftVocabulary
from specpilot.policies import ConstantPolicy, HeuristicPolicy, SvipPolicy

PROMPTS = [[1, 5, 9, 14], [1, 30, 31, 30, 31, 30], [1, 7], [1, 60, 2, 61, 62, 63, 64, 65], [3]]
BATCH = len(PROMPTS)
MAX_NEW = 20


@pytest.fixture(scope="module")
def target_model():
    return tiny_model("qwen2", seed=0, dtype=torch.float64)


@pytest.fixture(scope="module")
def draft_model(target_model):
    return perturbed(target_model, 0.3)


def single(target_model, config: GenerationConfig, max_length: int | None = None):
    engine = SpeculativeEngine(
        DecoderRunner(target_model, max_length), TinyTokenizer(), eos_ids=set()
    )
    return [engine.generate(p, config).token_ids for p in PROMPTS]


def batch_engine(target_model, draft_model, drafter_kind, policy, eos=(), max_length=None):
    drafter = None
    if drafter_kind == "ngram":
        drafter = NgramDrafter()
    elif drafter_kind.startswith("model"):
        vocabulary = (
            DraftVocabulary(torch.arange(48), 96) if drafter_kind == "model-subvocab" else None
        )
        branches = 3 if drafter_kind == "model-tree" else 1
        draft_runner = DecoderRunner(draft_model, max_length, batch_size=BATCH)
        drafter = ModelDrafter(draft_runner, vocabulary, branches)
    return SpeculativeEngine(
        DecoderRunner(target_model, max_length, batch_size=BATCH),
        TinyTokenizer(),
        drafter,
        policy,
        eos_ids=set(eos),
    )


CASES = [
    ("none", ConstantPolicy(1)),
    ("model", ConstantPolicy(3)),
    ("model", HeuristicPolicy()),
    ("model", SvipPolicy(h=0.72, max_k=6)),
    ("model-subvocab", ConstantPolicy(4)),
    ("model-tree", ConstantPolicy(3)),  # each row a tree: the chain plus 2 runner-up tokens
    ("ngram", ConstantPolicy(3)),
]


@pytest.mark.parametrize("drafter_kind,policy", CASES, ids=lambda c: repr(c))
def test_batch_rows_match_plain_greedy(target_model, draft_model, drafter_kind, policy):
    config = GenerationConfig(max_new_tokens=MAX_NEW)
    reference = single(target_model, config)
    engine = batch_engine(target_model, draft_model, drafter_kind, policy)
    results = engine.generate_batch(PROMPTS, config)
    assert [r.token_ids for r in results] == reference
    if drafter_kind.startswith("model"):
        accepted = [[rec.num_accepted for rec in r.stats.records] for r in results]
        assert len({tuple(a[:3]) for a in accepted}) > 1, "rows should accept ragged amounts"


def test_rows_finish_at_their_own_time(target_model, draft_model):
    """A short context: longer prompts hit the end first; an EOS id ends other rows early."""
    config = GenerationConfig(max_new_tokens=MAX_NEW)
    reference = single(target_model, config, max_length=16)
    eos = {reference[0][5]}  # row 0 (and any row producing this id) stops there
    engine = batch_engine(target_model, draft_model, "model", ConstantPolicy(3), eos, 16)
    plain = SpeculativeEngine(DecoderRunner(target_model, 16), TinyTokenizer(), eos_ids=eos)
    expected = [plain.generate(p, config) for p in PROMPTS]
    results = engine.generate_batch(PROMPTS, config)
    assert [r.token_ids for r in results] == [e.token_ids for e in expected]
    assert [r.finish_reason for r in results] == [e.finish_reason for e in expected]
    assert len({len(r.token_ids) for r in results}) > 1
    assert all(r.stats.total_s > 0 for r in results)


def test_last_running_row_drafts_in_its_own_slot(target_model, draft_model):
    """Row 0 reaches the context end first; row 1 then drafts alone and must still draft in
    slot 1: at the end each draft cache slot holds its own row's sequence up to the last step
    (drafts past it may have been rejected), not a batchmate's tokens or a stale prefix."""
    k = 3
    prompts = [list(range(4, 18)), [1, 7]]  # row 0 has room for 10 new tokens, row 1 for 20
    engine = batch_engine(target_model, draft_model, "model", ConstantPolicy(k), max_length=24)
    results = engine.generate_batch(prompts, GenerationConfig(max_new_tokens=MAX_NEW))
    assert len(results[0].stats.records) < len(results[1].stats.records)
    drafter = engine.drafter
    for slot, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        sequence = prompt + result.token_ids
        cached = drafter.runner.cached.slots[slot]
        assert common_prefix_length(cached, sequence) >= len(sequence) - (k + 1), slot
        assert drafter.runner.slot_lengths[slot][-1] == len(cached)


def test_batch_sampling_rows_equal_single_runs(target_model, draft_model):
    config = GenerationConfig(MAX_NEW, SamplingConfig(temperature=1.0), seed=7)
    reference = single(target_model, config)  # plain decoding, same seed per row
    spec_single = SpeculativeEngine(
        DecoderRunner(target_model),
        TinyTokenizer(),
        ModelDrafter(DecoderRunner(draft_model)),
        ConstantPolicy(3),
        eos_ids=set(),
    )
    expected = [spec_single.generate(p, config).token_ids for p in PROMPTS]
    engine = batch_engine(target_model, draft_model, "model", ConstantPolicy(3))
    assert [r.token_ids for r in engine.generate_batch(PROMPTS, config)] == expected
    plain_batch = batch_engine(target_model, draft_model, "none", ConstantPolicy(1))
    assert [r.token_ids for r in plain_batch.generate_batch(PROMPTS, config)] == reference


def test_batch_larger_than_slots_is_a_clear_error(target_model):
    engine = SpeculativeEngine(DecoderRunner(target_model, batch_size=2), TinyTokenizer())
    with pytest.raises(ConfigError, match="batch of 5 prompts"):
        engine.generate_batch(PROMPTS)


def test_packed_forward_equals_separate_forwards(target_model):
    """forward_batch's logits per row equal a single-slot forward of that row."""
    batched = DecoderRunner(target_model, batch_size=3)
    rows = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    out = batched.forward_batch(rows, [2, 0, 1])
    for row, logits in zip(rows, out, strict=True):
        alone = DecoderRunner(target_model).forward(row)
        torch.testing.assert_close(logits, alone, rtol=1e-9, atol=1e-9)
    more = batched.forward_batch([[10], [], [11, 12]], [2, 0, 1], logits="last")
    assert more[1] is None and more[0].shape[0] == 1 and more[2].shape[0] == 1
    alone = DecoderRunner(target_model)
    torch.testing.assert_close(more[2], alone.forward([5, 6, 7, 8, 9, 11, 12])[-1:])
    with pytest.raises(ValueError, match="distinct"):
        batched.forward_batch([[1], [2]], [0, 0])
