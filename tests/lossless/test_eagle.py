"""The feature drafter (EAGLE-3 head, EAGLE-2 dynamic trees) stays lossless.

Greedy identity against plain decoding for chains, trees, trees with SVIP's stop, batches of
rows that accept different counts, one-token prompts and the end of the context; the drafter's
cache after decoding equals a fresh catch-up over the committed sequence (its features follow
the target exactly); a prompt-lookup branch grafted on chains and trees keeps both; a
PPOW-trained head keeps float32 greedy identity; sampled output follows
the target's distribution (chi-square, T = 1 and T = 0.8 with top-k/top-p), and the same test
rejects a verifier that accepts every tree node; trees sized by measured goodput
(`TreeGoodputPolicy`) keep both.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from eagle_fixtures import accept_first_children, tiny_head, tiny_target
from test_engine_sampling import SAMPLINGS, VOCAB, chi_square_pvalue, exact_joint_distribution
from tiny import TinyTokenizer, cpu_training

import specpilot.engine.speculative as speculative
from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.drafting.eagle import EagleDrafter
from specpilot.drafting.eagle_head import EagleHead
from specpilot.engine import SpeculativeEngine
from specpilot.models.decoder import DecoderRunner
from specpilot.policies import ConstantPolicy, SvipPolicy
from specpilot.policies.tree_goodput import TreeGoodputPolicy
from specpilot.training.eagle.data import Sample
from specpilot.training.ppow import PpowConfig, train_ppow

PROMPTS = [[1, 5, 9, 14, 20, 7], [1, 33, 44], [1, 60, 61, 62, 63, 64, 65, 66, 67], [1]]
CONFIGS = {
    "chain": dict(depth=4, topk=1, nodes=1),
    "tree": dict(depth=4, topk=3, nodes=8),
    "wide-tree": dict(depth=5, topk=4, nodes=20),
    "chain-lookup": dict(depth=4, topk=1, nodes=1, lookup=6),
    "tree-lookup": dict(depth=4, topk=3, nodes=8, lookup=6),
}


@pytest.fixture(scope="module")
def model():
    return tiny_target()


@pytest.fixture(scope="module")
def plain_outputs(model):
    engine = SpeculativeEngine(DecoderRunner(model), TinyTokenizer(), eos_ids=set())
    config = GenerationConfig(max_new_tokens=30)
    return [engine.generate(p, config).token_ids for p in PROMPTS]


def eagle_engine(model, policy=None, batch_size=1, max_length=None, head=None, **options):
    runner = DecoderRunner(model, max_length=max_length, batch_size=batch_size)
    drafter = EagleDrafter(runner, head or tiny_head(runner), **options)
    policy = policy or ConstantPolicy(options["depth"])
    return SpeculativeEngine(runner, TinyTokenizer(), drafter, policy, eos_ids=set())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_identity(model, plain_outputs, name):
    engine = eagle_engine(model, **CONFIGS[name])
    accepted = 0
    for prompt, plain in zip(PROMPTS, plain_outputs, strict=True):
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=30))
        assert result.token_ids == plain
        accepted += result.stats.accepted
    assert accepted > 0  # some drafts were right, so accepted paths were committed


@pytest.mark.parametrize("name", ["chain-lookup", "tree-lookup"])
def test_the_lookup_branch_is_verified_beside_the_heads_draft(model, name):
    """The tiny target repeats itself, so prompt lookup finds continuations the head did not
    draft: those steps verify more nodes than the head's draft holds."""
    options = CONFIGS[name]
    engine = eagle_engine(model, **options)
    records = [
        record
        for prompt in PROMPTS
        for record in engine.generate(prompt, GenerationConfig(max_new_tokens=30)).stats.records
    ]
    head_nodes = options["depth"] if options["topk"] == 1 else options["nodes"]
    assert any(record.num_nodes > head_nodes for record in records)


def test_greedy_identity_with_svip_on_the_tree(model, plain_outputs):
    for keep_uncertain in (True, False):
        policy = SvipPolicy(h=0.9, max_k=5, keep_uncertain=keep_uncertain)
        engine = eagle_engine(model, policy, **CONFIGS["tree"])
        for prompt, plain in zip(PROMPTS, plain_outputs, strict=True):
            result = engine.generate(prompt, GenerationConfig(max_new_tokens=30))
            assert result.token_ids == plain
            assert min(r.num_drafted for r in result.stats.records) < 4  # SVIP cut some


@pytest.mark.parametrize("name", ["tree", "wide-tree", "tree-lookup"])
def test_greedy_identity_with_goodput_sized_trees(model, plain_outputs, name):
    """Tree sizes and depths chosen from the measured latency and past acceptance (an opening
    sweep, then the best size and depth, and re-probes) change what is verified, never the
    output."""
    policy = TreeGoodputPolicy(depth=CONFIGS[name]["depth"], probe_every=3)
    engine = eagle_engine(model, policy, **CONFIGS[name])
    head_nodes, depths = set(), set()
    for prompt, plain in zip(PROMPTS, plain_outputs, strict=True):
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=30))
        assert result.token_ids == plain
        head_nodes |= {r.num_nodes for r in result.stats.records}
        depths |= {r.num_drafted for r in result.stats.records if r.num_drafted > 0}
    assert len(head_nodes) >= 3  # the sweep verified several sizes
    assert len(depths) >= 2  # and the depth changed from step to step


@pytest.mark.parametrize("name", ["chain", "tree"])
def test_batch_rows_equal_single_runs(model, plain_outputs, name):
    engine = eagle_engine(model, batch_size=len(PROMPTS), **CONFIGS[name])
    results = engine.generate_batch(PROMPTS, GenerationConfig(max_new_tokens=30))
    assert [r.token_ids for r in results] == plain_outputs


def test_context_end_inside_a_tree(model):
    prompt = PROMPTS[0]
    plain = SpeculativeEngine(DecoderRunner(model, max_length=24), TinyTokenizer(), eos_ids=set())
    expected = plain.generate(prompt, GenerationConfig(max_new_tokens=100))
    engine = eagle_engine(model, max_length=24, **CONFIGS["wide-tree"])
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=100))
    assert result.token_ids == expected.token_ids and result.finish_reason == "length"


def test_drafter_cache_equals_a_fresh_catch_up(model):
    """After decoding, the head's committed cache equals feeding the committed sequence's
    target features to a fresh drafter: accepted paths, roots and rollbacks were all kept
    aligned with the target."""
    engine = eagle_engine(model, **CONFIGS["wide-tree"])
    prompt = PROMPTS[0]
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=30))
    drafter = engine.drafter
    state = drafter.slots[0]
    sequence = prompt + result.token_ids
    drafter.propose([sequence], [0], [1], [ConstantPolicy(1)], [SamplingConfig()], [None])
    fresh_runner = DecoderRunner(model)
    fresh = EagleDrafter(fresh_runner, drafter.head, depth=1, topk=1, nodes=1)
    out = fresh_runner.run_batch(
        [sequence[:-1]], [0], logits="none", tap_layers=fresh.feature_layers
    )
    taps = torch.cat([out[0].taps[k] for k in fresh.feature_layers], dim=-1)
    fresh.take_features(0, 0, taps, sequence[:-1])
    fresh.propose([sequence], [0], [1], [ConstantPolicy(1)], [SamplingConfig()], [None])
    n = len(sequence) - 1
    assert state.fed == fresh.slots[0].fed == n
    torch.testing.assert_close(state.k[:, :n], fresh.slots[0].k[:, :n])
    torch.testing.assert_close(state.v[:, :n], fresh.slots[0].v[:, :n])


@cpu_training
@pytest.mark.parametrize("name", ["chain", "tree"])
def test_ppow_trained_head_keeps_float32_greedy_identity(tmp_path, name):
    """A head after a few PPOW updates (saved and reloaded as decoding loads it) drafts for a
    float32 target whose output stays plain greedy decoding's."""
    model = tiny_target(torch.float32)
    runner = DecoderRunner(model, max_length=160)
    target = SimpleNamespace(runner=runner, tokenizer=None, name="tiny")
    generator = torch.Generator().manual_seed(0)
    samples = [
        Sample(f"s{i}", [1, 5, 6], torch.randint(4, 96, (24,), generator=generator).tolist())
        for i in range(6)
    ]
    config = PpowConfig(
        updates=3, windows_per_update=2, window=4, group=4, gamma=0.12, lr=1e-3,
        valid_samples=1, eval_every=3, save_every=3,
    )  # fmt: skip
    init = tiny_head(runner, draft_vocab=80, noise=0.1)
    train_ppow(target, samples, tmp_path, config, init, progress=False)
    head = EagleHead.load(tmp_path / "head", expected=init.shape)
    plain = SpeculativeEngine(DecoderRunner(model), TinyTokenizer(), eos_ids=set())
    engine = eagle_engine(model, head=head, **CONFIGS[name])
    accepted = 0
    for prompt in PROMPTS:
        expected = plain.generate(prompt, GenerationConfig(max_new_tokens=30)).token_ids
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=30))
        assert result.token_ids == expected
        accepted += result.stats.accepted
    assert accepted > 0


# -- sampling ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_target():
    return tiny_target(torch.float32, seed=3, vocab_size=VOCAB)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t0.8-topk-topp"])
@pytest.mark.parametrize("name", ["chain", "tree", "chain-lookup", "tree-lookup"])
def test_sampled_output_follows_target(small_target, name, sampling):
    options = dict(CONFIGS[name], depth=2)
    engine = eagle_engine(small_target, **options)
    expected = exact_joint_distribution(small_target, sampling)
    assert chi_square_pvalue(engine, expected, sampling) > 1e-3


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t0.8-topk-topp"])
def test_sampled_output_follows_target_with_goodput_sized_trees(small_target, sampling):
    policy = TreeGoodputPolicy(depth=2, probe_every=2)
    engine = eagle_engine(small_target, policy, **dict(CONFIGS["tree"], depth=2))
    expected = exact_joint_distribution(small_target, sampling)
    assert chi_square_pvalue(engine, expected, sampling) > 1e-3


def test_chi_square_rejects_a_tree_verifier_that_accepts_everything(small_target, monkeypatch):
    monkeypatch.setattr(speculative, "verify_tree", accept_first_children)
    engine = eagle_engine(small_target, **dict(CONFIGS["tree"], depth=2))
    sampling = SAMPLINGS[0]
    expected = exact_joint_distribution(small_target, sampling)
    assert chi_square_pvalue(engine, expected, sampling) < 1e-6


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["chain", "tree"])
def test_greedy_identity_on_cuda(plain_outputs, name):
    """The drafter and the tree path on a GPU (float32 there: its own plain run is the
    reference, since CPU and GPU kernels round differently)."""
    model = tiny_target(torch.float32).cuda()
    plain = SpeculativeEngine(DecoderRunner(model), TinyTokenizer(), eos_ids=set())
    engine = eagle_engine(model, **CONFIGS[name])
    for prompt in PROMPTS:
        expected = plain.generate(prompt, GenerationConfig(max_new_tokens=30)).token_ids
        assert engine.generate(prompt, GenerationConfig(max_new_tokens=30)).token_ids == expected
