"""LTD's learned depth and size policies keep the feature drafter lossless: greedy identity
(float32 and float64, both policies and each alone, check_every 2, batches) and sampled output
distributed as the target's (chi-square), with trees whose depth and size actually vary."""

from __future__ import annotations

import pytest
import torch
from eagle_fixtures import tiny_head, tiny_target
from ltd_fixtures import tiny_nets
from test_engine_sampling import SAMPLINGS, VOCAB, chi_square_pvalue, exact_joint_distribution
from tiny import TinyTokenizer, perturbed

from specpilot.config import GenerationConfig
from specpilot.drafting import ModelDrafter
from specpilot.drafting.eagle import EagleDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.models.decoder import DecoderRunner
from specpilot.policies.ltd import LtdPolicy
from specpilot.policies.ltd_net import LtdShape

PROMPTS = [[1, 5, 9, 14, 20, 7], [1, 33, 44], [1, 60, 61, 62, 63, 64, 65, 66, 67], [1]]
SHAPE = LtdShape(topk=3, max_depth=6, size_step=2, size_actions=8)


def ltd_engine(model, use="both", check_every=1, batch_size=1, nodes=8):
    runner = DecoderRunner(model, batch_size=batch_size)
    policy = LtdPolicy(tiny_nets(SHAPE), use, check_every)
    depth = SHAPE.max_depth if use != "size" else 3
    drafter = EagleDrafter(runner, tiny_head(runner), depth=depth, topk=SHAPE.topk, nodes=nodes)
    return SpeculativeEngine(runner, TinyTokenizer(), drafter, policy, eos_ids=set())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("use,check_every", [("both", 1), ("depth", 1), ("size", 1), ("both", 2)])
def test_greedy_identity(dtype, use, check_every):
    model = tiny_target(dtype)
    plain = SpeculativeEngine(DecoderRunner(model), TinyTokenizer(), eos_ids=set())
    engine = ltd_engine(model, use, check_every)
    depths, sizes, accepted = set(), set(), 0
    for prompt in PROMPTS:
        config = GenerationConfig(max_new_tokens=30)
        expected = plain.generate(prompt, config).token_ids
        result = engine.generate(prompt, config)
        assert result.token_ids == expected
        depths |= {r.num_drafted for r in result.stats.records}
        sizes |= {r.num_nodes for r in result.stats.records}
        accepted += result.stats.accepted
        assert result.stats.policy_s > 0
    assert accepted > 0
    if use != "size":
        assert len(depths) > 1  # the depth policy stopped at different levels
    if use != "depth":
        assert len(sizes) > 1


def test_batch_rows_equal_single_runs():
    model = tiny_target()
    plain = SpeculativeEngine(DecoderRunner(model), TinyTokenizer(), eos_ids=set())
    config = GenerationConfig(max_new_tokens=30)
    expected = [plain.generate(p, config).token_ids for p in PROMPTS]
    engine = ltd_engine(model, batch_size=len(PROMPTS))
    assert [r.token_ids for r in engine.generate_batch(PROMPTS, config)] == expected


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t0.8-topk-topp"])
def test_sampled_output_follows_target(sampling):
    model = tiny_target(torch.float32, seed=3, vocab_size=VOCAB)
    engine = ltd_engine(model)
    expected = exact_joint_distribution(model, sampling)
    assert chi_square_pvalue(engine, expected, sampling) > 1e-3


def test_model_drafter_trees_with_ltd_equal_plain():
    """The model drafter's dynamic trees take the same policies (depth: its budget)."""
    model = tiny_target()
    plain = SpeculativeEngine(DecoderRunner(model), TinyTokenizer(), eos_ids=set())
    drafter = ModelDrafter(DecoderRunner(perturbed(model, 0.3)), topk=SHAPE.topk, nodes=8)
    policy = LtdPolicy(tiny_nets(SHAPE))
    engine = SpeculativeEngine(
        DecoderRunner(model), TinyTokenizer(), drafter, policy, eos_ids=set()
    )
    depths = set()
    for prompt in PROMPTS:
        config = GenerationConfig(max_new_tokens=30)
        result = engine.generate(prompt, config)
        assert result.token_ids == plain.generate(prompt, config).token_ids
        depths |= {r.num_drafted for r in result.stats.records}
    assert len(depths) > 1
