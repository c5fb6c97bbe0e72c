"""The eagle drafter with its target on the ggml backend (llama.cpp over float32 GGUF files written
in the test): the ggml runner's taps, embedding rows and rotary tables equal the torch runner's
on the same weights (chain and tree forwards); eagle chains and dynamic trees (constant, sized
by tree-goodput, shaped by LTD's policies, budgeted row by row as the goodput controller does)
keep plain ggml greedy decoding's output, batch rows equal single runs; sampled output follows
the target's distribution (chi-square; LTD-shaped trees too), and the same test rejects a tree
verifier that accepts every node."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("llama_cpp")

import torch  # noqa: E402
from eagle_fixtures import accept_first_children, tiny_head  # noqa: E402
from gguf_fixtures import EXACT, ggml_runner  # noqa: E402
from ltd_fixtures import tiny_nets  # noqa: E402
from test_engine_sampling import (  # noqa: E402
    SAMPLINGS,
    VOCAB,
    chi_square_pvalue,
    exact_joint_distribution,
)
from test_goodput import ScriptedPlanner  # noqa: E402
from tiny import TinyTokenizer, tiny_model  # noqa: E402

import specpilot.engine.speculative as speculative  # noqa: E402
from specpilot.config import GenerationConfig  # noqa: E402
from specpilot.drafting.eagle import EagleDrafter  # noqa: E402
from specpilot.drafting.eagle_inputs import HeadInputs  # noqa: E402
from specpilot.engine import SpeculativeEngine  # noqa: E402
from specpilot.models.decoder import DecoderRunner  # noqa: E402
from specpilot.models.ggml import GgmlRunner  # noqa: E402
from specpilot.policies import ConstantPolicy  # noqa: E402
from specpilot.policies.ltd import LtdPolicy  # noqa: E402
from specpilot.policies.ltd_net import LtdShape  # noqa: E402
from specpilot.policies.tree_goodput import TreeGoodputPolicy  # noqa: E402

PROMPTS = [[1, 5, 9, 14, 20, 7], [1, 33, 44], [1, 60, 61, 62, 63, 64, 65, 66, 67], [1]]
MAX_NEW = 30
CONFIGS = {"chain": dict(depth=4, topk=1, nodes=1), "tree": dict(depth=4, topk=3, nodes=8)}
LAYERS = (1, 2, 3)
TREE = (-1, 0, 0, 1, 2, 2)  # a root's two children, each with children
LTD_SHAPE = LtdShape(topk=3, max_depth=6, size_step=2, size_actions=8)


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen2", seed=0)


@pytest.fixture(scope="module")
def path(model, tmp_path_factory):
    return tmp_path_factory.mktemp("ggml-eagle") / "target.gguf"


@pytest.fixture(scope="module")
def head(model):
    return tiny_head(DecoderRunner(model))


@pytest.fixture(scope="module")
def plain_outputs(model, path):
    engine = SpeculativeEngine(ggml_runner(model, path), TinyTokenizer(), eos_ids=set())
    return [engine.generate(p, GenerationConfig(max_new_tokens=MAX_NEW)).token_ids for p in PROMPTS]


def ltd_engine(model, path, head, batch_size=1):
    """Eagle trees shaped by small random LTD policies whose decisions vary (ltd_fixtures)."""
    tree = dict(depth=LTD_SHAPE.max_depth, topk=LTD_SHAPE.topk, nodes=8)
    policy = LtdPolicy(tiny_nets(LTD_SHAPE))
    return eagle_engine(model, path, head, policy, batch_size=batch_size, **tree)


def eagle_engine(model, path, head, policy=None, batch_size=1, planner=None, **options):
    runner = ggml_runner(model, path, batch_size=batch_size)
    inputs = HeadInputs.of_gguf(runner, model.config)
    drafter = EagleDrafter(runner, head, inputs=inputs, **options)
    policy = policy or ConstantPolicy(options["depth"])
    return SpeculativeEngine(
        runner, TinyTokenizer(), drafter, policy, eos_ids=set(), planner=planner
    )


def test_taps_equal_the_torch_runners(model, path):
    """A prefill, a chain step and a tree (rows of two slots in one forward) tap the same
    hidden states on both backends."""
    ggml = ggml_runner(model, path, batch_size=2)
    ggml.enable_taps()
    torch_runner = DecoderRunner(model, batch_size=2)
    forwards = [
        ([[1, 5, 9, 14], [1, 33]], None),
        ([[20, 7], [44, 45, 46]], None),
        ([[8, 10, 11, 12, 13, 15, 16], [47]], [TREE, None]),
    ]
    for rows, trees in forwards:
        expected = torch_runner.run_batch(rows, [0, 1], tap_layers=LAYERS, trees=trees)
        got = ggml.run_batch(rows, [0, 1], tap_layers=LAYERS, trees=trees)
        for mine, theirs in zip(got, expected, strict=True):
            assert sorted(mine.taps) == list(LAYERS)
            for k in LAYERS:
                torch.testing.assert_close(mine.taps[k], theirs.taps[k], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(mine.logits, theirs.logits, rtol=1e-4, atol=1e-4)
    untapped = ggml.run_batch([[3], [4]], [0, 1], logits="none")
    assert untapped[0].taps == {} and untapped[0].logits is None


def test_taps_of_a_forward_split_into_micro_batches(model, path):
    """A forward longer than llama.cpp's micro-batch (n_ubatch) taps every token, in order."""
    ggml_runner(model, path)  # writes the GGUF
    runner = GgmlRunner(path, 256, 1, dataclasses.replace(EXACT, n_ubatch=4))
    runner.enable_taps()
    row = [1, 5, 9, 14, 20, 7, 33, 44, 45, 46, 2]
    got = runner.run_batch([row], [0], logits="last", tap_layers=LAYERS)[0]
    expected = DecoderRunner(model).run_batch([row], [0], logits="last", tap_layers=LAYERS)[0]
    for k in LAYERS:
        torch.testing.assert_close(got.taps[k], expected.taps[k], rtol=1e-4, atol=1e-4)


def test_a_runner_taps_only_once_enabled(model, path):
    runner = ggml_runner(model, path)
    with pytest.raises(RuntimeError, match="enable_taps"):
        runner.run_batch([[1, 2]], [0], tap_layers=(2,))
    runner.enable_taps()
    with pytest.raises(ValueError, match="1..3"):
        runner.run_batch([[1, 2]], [0], tap_layers=(4,))


def test_head_inputs_equal_the_torch_runners(model, path):
    """The GGUF's embedding rows and the config's rotary tables are the torch runner's."""
    ids = [0, 7, 95, 7, 3]
    mine = HeadInputs.of_gguf(ggml_runner(model, path), model.config)
    theirs = HeadInputs.of_decoder(DecoderRunner(model))
    assert mine.dtype == theirs.dtype == torch.float32
    torch.testing.assert_close(mine.embed(ids), theirs.embed(ids), rtol=0, atol=0)
    torch.testing.assert_close(mine.cos, theirs.cos, rtol=0, atol=0)
    torch.testing.assert_close(mine.sin, theirs.sin, rtol=0, atol=0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_identity(model, path, head, plain_outputs, name):
    engine = eagle_engine(model, path, head, **CONFIGS[name])
    accepted = 0
    for prompt, plain in zip(PROMPTS, plain_outputs, strict=True):
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
        assert result.token_ids == plain
        accepted += result.stats.accepted
    assert accepted > 0  # some drafts were right, so accepted paths were committed


def test_greedy_identity_with_goodput_sized_trees(model, path, head, plain_outputs):
    policy = TreeGoodputPolicy(depth=4, probe_every=3)
    engine = eagle_engine(model, path, head, policy, **CONFIGS["tree"])
    sizes = set()
    for prompt, plain in zip(PROMPTS, plain_outputs, strict=True):
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW))
        assert result.token_ids == plain
        sizes |= {r.num_nodes for r in result.stats.records}
    assert len(sizes) >= 3  # the sweep verified several sizes


@pytest.mark.parametrize("batch_size", [1, len(PROMPTS)])
def test_greedy_identity_with_ltd_shaped_trees(model, path, head, plain_outputs, batch_size):
    engine = ltd_engine(model, path, head, batch_size)
    config = GenerationConfig(max_new_tokens=MAX_NEW)
    if batch_size > 1:
        assert [r.token_ids for r in engine.generate_batch(PROMPTS, config)] == plain_outputs
        return
    depths, sizes = set(), set()
    for prompt, plain in zip(PROMPTS, plain_outputs, strict=True):
        result = engine.generate(prompt, config)
        assert result.token_ids == plain
        depths |= {r.num_drafted for r in result.stats.records}
        sizes |= {r.num_nodes for r in result.stats.records}
    assert len(depths) >= 2 and len(sizes) >= 2  # the policies shaped the trees


@pytest.mark.parametrize("name", list(CONFIGS))
def test_batch_rows_equal_single_runs(model, path, head, plain_outputs, name):
    engine = eagle_engine(model, path, head, batch_size=len(PROMPTS), **CONFIGS[name])
    results = engine.generate_batch(PROMPTS, GenerationConfig(max_new_tokens=MAX_NEW))
    assert [r.token_ids for r in results] == plain_outputs


@pytest.mark.parametrize("name", list(CONFIGS))
def test_rows_budgeted_apart_keep_plain_greedy(model, path, head, plain_outputs, name):
    """The goodput controller's shape on ggml (eagle's default there): in one batch some rows
    draft their cap, some one token, some nothing, and some steps draft nothing at all."""
    planner = ScriptedPlanner()
    engine = eagle_engine(
        model, path, head, batch_size=len(PROMPTS), planner=planner, **CONFIGS[name]
    )
    results = engine.generate_batch(PROMPTS, GenerationConfig(max_new_tokens=MAX_NEW))
    assert [r.token_ids for r in results] == plain_outputs
    drafted = [record.num_drafted for r in results for record in r.stats.records]
    assert 0 in drafted and max(drafted) > 1
    assert sum(r.stats.accepted for r in results) > 0


# -- sampling ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A target over VOCAB tokens (the chi-square tests' joint distribution), its GGUF, a head."""
    target = tiny_model("qwen2", vocab_size=VOCAB, seed=3)
    path = tmp_path_factory.mktemp("ggml-eagle-sampling") / "target.gguf"
    return target, path, tiny_head(DecoderRunner(target))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sampled_output_follows_target(small, name):
    target, path, head = small
    sampling = SAMPLINGS[1]
    engine = eagle_engine(target, path, head, **dict(CONFIGS[name], depth=2))
    expected = exact_joint_distribution(target, sampling)
    assert chi_square_pvalue(engine, expected, sampling) > 1e-3


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sampled_output_under_budgets_follows_target(small, name):
    """The goodput controller's shape under sampling: steps that draft the cap, one token or
    nothing (ScriptedPlanner) keep the target's distribution."""
    target, path, head = small
    sampling = SAMPLINGS[1]
    engine = eagle_engine(
        target, path, head, planner=ScriptedPlanner(), **dict(CONFIGS[name], depth=2)
    )
    expected = exact_joint_distribution(target, sampling)
    assert chi_square_pvalue(engine, expected, sampling) > 1e-3
    assert {0, 1} <= {b for plan in engine.planner.plans for b in plan}


def test_sampled_output_with_ltd_shaped_trees_follows_target(small):
    target, path, head = small
    sampling = SAMPLINGS[1]
    engine = ltd_engine(target, path, head)
    expected = exact_joint_distribution(target, sampling)
    assert chi_square_pvalue(engine, expected, sampling) > 1e-3


def test_chi_square_rejects_a_tree_verifier_that_accepts_everything(small, monkeypatch):
    monkeypatch.setattr(speculative, "verify_tree", accept_first_children)
    target, path, head = small
    engine = eagle_engine(target, path, head, **dict(CONFIGS["tree"], depth=2))
    sampling = SAMPLINGS[0]
    expected = exact_joint_distribution(target, sampling)
    assert chi_square_pvalue(engine, expected, sampling) < 1e-6
