"""serve.spec_stats: the per-request usage numbers and vLLM's spec-decode counters from a
request's step records (chain and tree steps, and steps that drafted nothing)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from specpilot.engine import GenerationStats
from specpilot.serve.spec_stats import SpecDecodeCounters, SpecStats
from specpilot.types import StepRecord


def step(verified: int, accepted: int, emitted: int) -> StepRecord:
    return StepRecord(verified + 1, verified, accepted, emitted, 0.0, 0.0, 10, verified)


STEPS = [step(3, 3, 4), step(3, 1, 2), step(0, 0, 1), step(2, 0, 1), step(4, 2, 3)]


def test_usage_counts_drafts_like_vllm():
    stats = GenerationStats()
    for record in STEPS:
        stats.add(record)
    usage = SpecStats.of(stats).usage()
    assert usage == {
        "num_spec_steps": 4,  # the step that verified nothing is no draft
        "num_draft_tokens": 12,
        "num_accepted_draft_tokens": 6,
        "draft_acceptance_rate": 0.5,
        "mean_acceptance_length": 1 + 6 / 4,
        "acceptance_histogram": [1, 1, 1, 1],
        "verify_steps": 5,
        "mean_accepted_tokens": 11 / 5,
        "accepted_per_position": [3, 2, 1, 0],
    }


def test_no_steps_gives_no_rates():
    usage = SpecStats.of(GenerationStats()).usage()
    assert usage["num_spec_steps"] == usage["verify_steps"] == 0
    assert usage["draft_acceptance_rate"] is usage["mean_acceptance_length"] is None
    assert usage["acceptance_histogram"] == [] == usage["accepted_per_position"]


def test_counters_add_up_over_requests():
    registry = CollectorRegistry()
    counters = SpecDecodeCounters(registry, "m")
    stats = GenerationStats()
    for record in STEPS:
        stats.add(record)
    for _ in range(2):
        counters.observe(SpecStats.of(stats))
    labels = {"model_name": "m", "engine": "0"}

    def value(name: str, **extra) -> float:
        return registry.get_sample_value(name + "_total", {**labels, **extra})

    assert value("vllm:spec_decode_num_drafts") == 8
    assert value("vllm:spec_decode_num_draft_tokens") == 24
    assert value("vllm:spec_decode_num_accepted_tokens") == 12
    per_pos = [
        value("vllm:spec_decode_num_accepted_tokens_per_pos", position=str(i)) for i in range(4)
    ]
    assert per_pos == pytest.approx([6, 4, 2, 0])
