"""Continuous batching (engine.scheduler): requests admitted into a running batch, finishing or
cancelled at their own time, each with its own generation config, must give exactly what they
give alone: greedy token for token (float32), sampled the same tokens for the same seed (every
request has its own generator and policy copy)."""

from __future__ import annotations

import pytest
from test_prefix_reuse import make_engine
from tiny import perturbed, tiny_model

from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.engine import Scheduler
from specpilot.errors import ConfigError

PROMPTS = [[1, 5, 9, 14], [1, 30, 31, 30, 31, 30], [1, 7], [1, 60, 2, 61, 62, 63], [3, 4]]
CONFIGS = [
    GenerationConfig(16),
    GenerationConfig(12, SamplingConfig(temperature=1.0), seed=7),
    GenerationConfig(9, SamplingConfig(temperature=0.7, top_k=20, top_p=0.9), seed=3),
    GenerationConfig(20, stop_strings=(" t4",)),
    GenerationConfig(5, SamplingConfig(temperature=1.3), seed=11),
]
KINDS = ["none", "model", "model-dynamic", "ngram", "eagle", "dvi-shared"]


@pytest.fixture(scope="module")
def target_model():
    return tiny_model("qwen2", seed=0)  # float32


@pytest.fixture(scope="module")
def draft_model(target_model):
    return perturbed(target_model, 0.3)


def solo(kind, target_model, draft_model):
    """Each request decoded alone, on a fresh engine."""
    return [
        make_engine(kind, target_model, draft_model).generate(prompt, config)
        for prompt, config in zip(PROMPTS, CONFIGS, strict=True)
    ]


@pytest.mark.parametrize("chunk", [None, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_requests_admitted_mid_run_equal_solo_runs(kind, chunk, target_model, draft_model):
    """Two slots, five requests arriving while others run: each joins when a slot frees, and
    every request's tokens (and streamed tokens) equal its solo run's; also with prompts
    prefilled 2 tokens per step (chunked prefill)."""
    expected = solo(kind, target_model, draft_model)
    engine = make_engine(kind, target_model, draft_model, batch_size=2)
    scheduler = Scheduler(engine, prefill_chunk=chunk)
    streamed = [[] for _ in PROMPTS]
    requests = [scheduler.submit(PROMPTS[0], CONFIGS[0], streamed[0].extend)]
    scheduler.step()
    scheduler.step()
    for i in range(1, len(PROMPTS)):
        requests.append(scheduler.submit(PROMPTS[i], CONFIGS[i], streamed[i].extend))
    scheduler.step()
    assert len(scheduler.active) == 2 and len(scheduler.waiting) == 3
    assert requests[0].generated and requests[1].slot is not None
    scheduler.run()
    assert sorted(scheduler.free) == [0, 1]
    for request, reference, tokens in zip(requests, expected, streamed, strict=True):
        assert request.result.token_ids == reference.token_ids
        assert request.result.finish_reason == reference.finish_reason
        assert request.result.text == reference.text
        assert tokens == reference.token_ids


def test_cancel_frees_the_slot_for_the_next_request(target_model, draft_model):
    engine = make_engine("model", target_model, draft_model, batch_size=1)
    expected = make_engine("model", target_model, draft_model).generate(PROMPTS[1], CONFIGS[1])
    scheduler = Scheduler(engine)
    finished = []
    first = scheduler.submit(PROMPTS[0], GenerationConfig(100), on_finish=finished.append)
    queued = scheduler.submit(PROMPTS[2], GenerationConfig(100), on_finish=finished.append)
    second = scheduler.submit(PROMPTS[1], CONFIGS[1], on_finish=finished.append)
    scheduler.step()
    queued.cancel()  # cancelled while waiting: it never takes a slot
    assert scheduler.step() == [queued] and not queued.result.token_ids
    assert first.slot == 0 and first.generated and second.slot is None
    first.cancel()
    assert scheduler.step() == [first] and second.slot == 0 and first.slot is None
    assert finished == [queued, first]
    assert [r.result.finish_reason for r in finished] == ["cancelled", "cancelled"]
    scheduler.run()
    assert second.result.token_ids == expected.token_ids
    assert scheduler.idle and scheduler.free == [0]


def test_a_returning_prompt_takes_the_slot_holding_its_prefix(target_model, draft_model):
    """Admission picks the free slot that holds the longest prefix of the prompt, so the next
    turn of a conversation prefills only its new tokens."""
    engine = make_engine("model", target_model, draft_model, batch_size=3)
    first = engine.generate_batch(PROMPTS[:3], GenerationConfig(6))
    follow_up = PROMPTS[2] + first[2].token_ids + [40, 41]
    scheduler = Scheduler(engine)
    request = scheduler.submit(follow_up, GenerationConfig(6))
    scheduler.run()
    assert request.stats.prefill_tokens == 2
    fresh = make_engine("model", target_model, draft_model).generate(follow_up, GenerationConfig(6))
    assert request.result.token_ids == fresh.token_ids


@pytest.mark.parametrize("kind", ["model", "eagle"])
def test_a_chunked_prefill_lets_running_rows_decode(kind, target_model, draft_model):
    """A long prompt admitted beside a running row is prefilled `prefill_chunk` tokens per step
    while the running row emits tokens in each of those steps; both equal their solo runs."""
    long_prompt = [1, *range(20, 47)]
    configs = [GenerationConfig(40), GenerationConfig(8)]
    expected = [
        make_engine(kind, target_model, draft_model).generate(prompt, config)
        for prompt, config in zip([PROMPTS[0], long_prompt], configs, strict=True)
    ]
    scheduler = Scheduler(make_engine(kind, target_model, draft_model, batch_size=2), False, 4)
    running = scheduler.submit(PROMPTS[0], configs[0])
    scheduler.step()
    joining = scheduler.submit(long_prompt, configs[1])
    read = []
    while not joining.prefilled:
        emitted = len(running.generated)
        scheduler.step()
        read.append(joining.stats.prefill_tokens)
        assert len(running.generated) > emitted or running.reason is not None
    assert read == [4, 8, 12, 16, 20, 24, 27]  # 27 = the prompt less its last token
    scheduler.run()
    assert running.result.token_ids == expected[0].token_ids
    assert joining.result.token_ids == expected[1].token_ids


def test_a_prefill_chunk_must_be_positive(target_model, draft_model):
    with pytest.raises(ConfigError, match="prefill chunk"):
        Scheduler(make_engine("none", target_model, draft_model), prefill_chunk=0)
