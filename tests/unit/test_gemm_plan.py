"""The measured GEMM plan (models.gemm): choosing from timings, products equal to the plain
product whatever the plan pads or relays, a runner following a plan decoding the same tokens,
and the plan cached per machine."""

import math

import pytest
import torch
from tiny import TinyTokenizer, perturbed, tiny_model

from specpilot.config import GenerationConfig
from specpilot.drafting import ModelDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.models import gemm
from specpilot.models.decoder import DecoderRunner
from specpilot.models.gemm import GemmPlan, linear
from specpilot.policies import ConstantPolicy


def test_choose_pads_and_relays_only_where_it_pays():
    seconds = {  # one row: torch.mv, timed under "row"
        "row": [3.0, 2.0, 3.0, 1.0, 5.0, 5.0],
        "column": [math.inf, 2.5, 1.0, 4.0, 4.0, 6.0],
    }
    plan = GemmPlan.choose(seconds)
    # 1 and 2 rows: padding to 4 row-major (1.0) beats mv (3.0) and 2 rows (2.0); 3:
    # column-major as they are; 5: column-major 4.0 (padding to 6 is slower); 6: row-major.
    assert plan.rows == (4, 4, 3, 4, 5, 6)
    assert plan.layouts == ("row", "row", "column", "row", "column", "row")
    close = {"row": [1.0, 1.0, 0.95], "column": [math.inf, 1.2, 1.2]}
    assert GemmPlan.choose(close).rows == (1, 2, 3)  # a 5 % saving is within timing noise


def test_plan_validates_entries():
    with pytest.raises(ValueError, match="2 rows"):
        GemmPlan((1, 1), ("row", "row"))
    with pytest.raises(ValueError, match="one layout"):
        GemmPlan((1, 2), ("row",))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 9])
def test_planned_product_equals_plain_product(n):
    generator = torch.Generator().manual_seed(n)
    weight = torch.randn(40, 24, dtype=torch.float64, generator=generator)
    bias = torch.randn(40, dtype=torch.float64, generator=generator)
    x = torch.randn(24, n, dtype=torch.float64, generator=generator).t()  # column-major rows
    plan = GemmPlan((2, 4, 4, 4, 8, 8, 8, 8), ("column", "column", "row", "row") * 2)
    expected = x @ weight.t() + bias
    torch.testing.assert_close(linear(x, weight, bias, plan), expected)
    torch.testing.assert_close(linear(x, weight, bias, None), expected)


def test_runner_following_a_plan_decodes_the_same_tokens():
    """Greedy speculative decoding (chains of 4: 5-row verifies, padded to 8; the draft's and
    the LM head's single rows padded too) with every planned product padded decodes token for
    token what plain decoding does without a plan."""
    target = tiny_model("qwen2", seed=0, dtype=torch.float64)
    draft = perturbed(target, 0.3)
    config = GenerationConfig(max_new_tokens=24)
    prompt = [1, 5, 9, 14, 30, 31]
    plain = SpeculativeEngine(DecoderRunner(target), TinyTokenizer(), eos_ids=set())
    expected = plain.generate(prompt, config).token_ids
    plan = GemmPlan((8,) * 8, ("row", "column") * 4)
    runner, draft_runner = DecoderRunner(target), DecoderRunner(draft)
    runner.gemm_plans = draft_runner.gemm_plans = {"gate_up": plan, "down": plan, "lm_head": plan}
    engine = SpeculativeEngine(
        runner, TinyTokenizer(), ModelDrafter(draft_runner), ConstantPolicy(k=4), eos_ids=set()
    )
    result = engine.generate(prompt, config)
    assert result.token_ids == expected
    assert result.stats.mean_accepted_tokens > 1.0  # the planned verify path did run


def test_plan_is_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path))
    monkeypatch.setattr(gemm, "MIN_BYTES", 0)
    calls = []
    real = gemm.measure
    monkeypatch.setattr(
        gemm, "measure", lambda w, rows: calls.append(rows) or real(w, max_rows=4, rounds=1)
    )
    weight = torch.randn(64, 32)
    first = gemm.plan_for(weight)
    assert first is not None and len(first.rows) == 4 and len(calls) == 1
    assert gemm.plan_for(weight) == first and len(calls) == 1  # from the disk cache
    (cached,) = (tmp_path / "gemm").glob("*.json")
    cached.write_text("{not json")
    assert gemm.plan_for(weight) is not None and len(calls) == 2  # unreadable: measured again
    assert len(gemm.plan_for(weight, 3).rows) == 4 and calls == [48, 48, 3]  # other rows: own entry
    monkeypatch.setenv("SPECPILOT_GEMM_PLAN", "0")
    assert gemm.plan_for(weight) is None
