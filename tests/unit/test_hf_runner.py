"""HFRunner rollback: a cropped DynamicCache must score new tokens exactly like a fresh cache,
and a rollback the cache cannot honour must fail loudly instead of attending to wrong states."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_generic

from specpilot.errors import ConfigError
from specpilot.models.hf_adapter import HFRunner

SEQUENCE = [1, 5, 9, 14, 3, 7, 22, 40, 41, 8, 12]


@pytest.mark.parametrize("kind", ["gpt2", "gemma3"])
def test_rollback_then_forward_equals_fresh_cache(kind):
    model = tiny_generic(kind)
    runner = HFRunner(model)
    runner.forward(SEQUENCE[:7])
    runner.forward([50, 51, 52])  # a rejected draft, longer than Gemma 3's window of 4
    runner.rollback(7)
    assert runner.length == 7
    fresh = HFRunner(model)
    fresh.forward(SEQUENCE[:7])
    torch.testing.assert_close(runner.forward(SEQUENCE[7:]), fresh.forward(SEQUENCE[7:]))


def test_windowed_cache_cannot_roll_back_past_its_last_crop():
    runner = HFRunner(tiny_generic("gemma3"))
    runner.forward(SEQUENCE[:9])
    runner.rollback(8)  # the windowed layers now keep only the window before position 8
    with pytest.raises(RuntimeError, match="cannot roll back to 5"):
        runner.rollback(5)
    runner.rollback(0)  # a reset is always possible
    assert runner.length == 0


def test_full_attention_cache_rolls_back_anywhere():
    model = tiny_generic("gpt2")
    runner = HFRunner(model)
    runner.forward(SEQUENCE[:9])
    runner.rollback(8)
    runner.rollback(3)
    fresh = HFRunner(model)
    fresh.forward(SEQUENCE[:3])
    torch.testing.assert_close(runner.forward(SEQUENCE[3:]), fresh.forward(SEQUENCE[3:]))


def test_recurrent_state_cannot_roll_back():
    runner = HFRunner(tiny_generic("gpt2"))
    runner.forward(SEQUENCE)
    runner.cache.layers[0].is_croppable = False  # what linear-attention/SSM layers report
    with pytest.raises(ConfigError, match="decode without a drafter"):
        runner.rollback(4)
