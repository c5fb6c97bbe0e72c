"""Draft trees (a chain plus the draft's runner-up first tokens, `branches` > 1) stay lossless.

The tree layout and the runner's tree forward equal running each branch as a chain, and the
cache kept after a tree equals the chain's; the tree verifier's output follows the target's
distribution exactly (chi-square on the pure function, then through the engine with a model
drafter and with DVI). Greedy identity with trees: test_dvi_lossless.py (alone, more accepted
than chains, up to the end of the context) and test_batch.py (a batch of model-drafter trees).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from test_dvi_lossless import trained_head
from test_engine_sampling import SAMPLINGS, chi_square_pvalue, exact_joint_distribution
from tiny import TinyTokenizer, perturbed, tiny_model

from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.drafting import ModelDrafter
from specpilot.drafting.layer_split import LayerSplitDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.errors import ConfigError
from specpilot.methods import make_drafter
from specpilot.models.decoder import DecoderRunner
from specpilot.models.pair import ModelPair
from specpilot.policies import ConstantPolicy, HeuristicPolicy
from specpilot.policies.tree_goodput import TreeGoodputPolicy
from specpilot.sampling import sample
from specpilot.tree import children, graft, tree_depths, tree_mask
from specpilot.types import Proposal, VerifyResult
from specpilot.verify.tree import verify_tree

# A chain of two (nodes 0, 1) with two runner-up siblings of node 0 (nodes 2, 3).
PARENTS = (-1, 0, -1, -1)


def test_tree_layout():
    assert tree_depths(PARENTS) == [1, 2, 1, 1]
    assert children(PARENTS) == [[0, 2, 3], [1], [], [], []]
    expected = [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 0, 0, 1, 0],
        [1, 0, 0, 0, 1],
    ]
    assert tree_mask(PARENTS).tolist() == [[bool(v) for v in row] for row in expected]
    with pytest.raises(ValueError, match="precede"):
        tree_depths((-1, 1))


def test_graft_follows_matching_nodes_and_adds_the_rest():
    tokens, parents = [5, 6, 7, 8], PARENTS  # 5 → 6, and 7, 8 beside 5
    assert graft(tokens, parents, [5, 6, 9, 10]) == ([5, 6, 7, 8, 9, 10], (-1, 0, -1, -1, 1, 4))
    assert graft(tokens, parents, [7, 6]) == ([5, 6, 7, 8, 6], (-1, 0, -1, -1, 2))
    assert graft(tokens, parents, [5, 6]) == (tokens, parents)  # already in the tree
    assert graft([], (), [3, 4]) == ([3, 4], (-1, 0))
    assert graft(tokens, parents, []) == (tokens, parents)


def test_proposal_chain_and_path_helpers():
    proposal = Proposal([5, 6, 7, 8], parents=PARENTS)
    assert proposal.chain_length == 2
    assert proposal.depth == 2 and Proposal([5, 6, 7]).depth == 3
    assert Proposal([5, 6, 7], parents=(-1, -1, 1)).depth == 2
    assert proposal.truncated(3).parents == (-1, 0, -1)
    assert Proposal([5, 6]).chain_length == 2
    through_sibling = VerifyResult(1, 9, (2,))
    assert through_sibling.emitted(proposal.tokens) == [7, 9]
    assert through_sibling.chain_accepted == 0
    assert VerifyResult(2, 9, (0, 1)).chain_accepted == 2


def test_runner_tree_forward_and_kept_path_equal_the_chain():
    """Each node's logits equal its branch fed as a chain; after keep_path the cache decodes on
    exactly as if the accepted branch had been fed alone."""
    model = tiny_model("qwen2", dtype=torch.float64)
    prefix, root, nodes = [4, 5, 6], 7, [8, 9, 10, 11]
    tree_runner, chain_runner = DecoderRunner(model), DecoderRunner(model)
    tree_runner.forward(prefix)
    logits = tree_runner.forward_batch([[root, *nodes]], [0], trees=[PARENTS])[0]
    chain_runner.forward(prefix)
    chain = chain_runner.forward([root, 8, 9])  # root → node 0 → node 1
    torch.testing.assert_close(logits[[0, 1, 2]], chain)
    for node in (2, 3):  # the siblings of node 0
        chain_runner.rollback(len(prefix) + 1)
        torch.testing.assert_close(logits[node + 1], chain_runner.forward([nodes[node]])[0])

    tree_runner.keep_path(0, len(prefix), (2,))  # accept node 2 (token 10), then emit 12
    tree_runner.rollback(len(prefix) + 2)
    chain_runner.rollback(len(prefix) + 1)
    chain_runner.forward([10])
    torch.testing.assert_close(tree_runner.forward([12, 13]), chain_runner.forward([12, 13]))


class ScriptedTree:
    """Proposes the target's greedy continuation as the chain, plus two wrong first tokens."""

    def __init__(self, full: list[int]):
        self.full = full

    def reset(self) -> None:
        pass

    def propose(self, sequences, slots, budgets, policies, samplings, generators):
        (sequence,), (budget,) = sequences, budgets
        chain = self.full[len(sequence) : len(sequence) + budget]
        wrong = [t for t in range(3, 8) if t != chain[0]][:2]
        return [Proposal(chain + wrong, parents=(*range(-1, len(chain) - 1), -1, -1))]


def test_tree_steps_count_depth():
    """A tree whose whole chain is accepted is an all-accepted step: the heuristic policy grows
    k (+2 each step), and drafted, verified, accepted and acceptance by position count depth
    along the chain, while `nodes` counts what the target verified (siblings included)."""
    model = tiny_model("qwen2", dtype=torch.float64)
    prompt = [1, 5, 9, 14]
    plain = SpeculativeEngine(DecoderRunner(model), TinyTokenizer(), eos_ids=set())
    full = prompt + plain.generate(prompt, GenerationConfig(max_new_tokens=40)).token_ids
    engine = SpeculativeEngine(
        DecoderRunner(model), TinyTokenizer(), ScriptedTree(full), HeuristicPolicy(), eos_ids=set()
    )
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=30))
    assert result.token_ids == full[len(prompt) : len(prompt) + 30]
    records = result.stats.records
    # k = 5, 7, 9, then the 5 tokens of room left before max_new_tokens
    assert [r.num_drafted for r in records] == [5, 7, 9, 5]
    assert all(r.num_verified == r.num_accepted == r.num_drafted for r in records)
    assert [r.num_nodes for r in records] == [7, 9, 11, 7]
    stats = result.stats
    assert (stats.drafted, stats.verified, stats.accepted, stats.nodes) == (26, 26, 26, 34)
    assert stats.acceptance_rate == 1.0
    assert stats.acceptance_by_position == [1.0] * 9


def test_verify_tree_greedy_follows_the_matching_branch():
    logits = torch.full((5, 16), -1.0)
    logits[0, 10] = 5.0  # the target wants 10 after the root: the sibling node 2
    logits[3, 14] = 5.0  # and 14 after node 2
    greedy = SamplingConfig(temperature=0.0)
    result = verify_tree([8, 9, 10, 11], PARENTS, None, logits, greedy, None)
    assert (result.path, result.next_token, result.num_accepted) == ((2,), 14, 1)
    logits[0, 10], logits[0, 8], logits[1, 9], logits[2, 3] = -1.0, 5.0, 5.0, 5.0
    result = verify_tree([8, 9, 10, 11], PARENTS, None, logits, greedy, None)
    assert (result.path, result.next_token) == ((0, 1), 3)


def _first_two_tokens(trials: int, target_probs: torch.Tensor, draft: torch.Tensor) -> np.ndarray:
    """Counts of the first two emitted tokens (second = vocab when the step emitted one) over
    `trials` verifications of a fresh tree each: node 0 sampled from `draft`, node 1 its
    deterministic child (token 0), nodes 2 and 3 the draft's two most likely other tokens.
    target_probs row 0 is the target after the root, row 1 + t after token t."""
    vocab = draft.shape[0]
    counts = np.zeros((vocab, vocab + 1))
    generator = torch.Generator().manual_seed(0)
    sampling = SamplingConfig(temperature=1.0)
    for _ in range(trials):
        first = sample(draft, generator)
        runners_up = [i for i in draft.topk(3).indices.tolist() if i != first][:2]
        tokens = [first, 0, *runners_up]
        # verifier rows: after the root, after each node (node 1's row is never reached here)
        rows = [0, 1 + first, 0, 1 + runners_up[0], 1 + runners_up[1]]
        logits = target_probs[rows].log()
        result = verify_tree(tokens, PARENTS, draft[None], logits, sampling, generator)
        emitted = result.emitted(tokens)
        counts[emitted[0], emitted[1] if len(emitted) > 1 else vocab] += 1
    return counts


def _pvalue(observed: np.ndarray, wanted: np.ndarray) -> float:
    keep = wanted > 0
    assert observed[~keep].sum() == 0, "a token the target cannot emit"
    return chisquare(observed[keep], wanted[keep] * observed.sum() / wanted[keep].sum()).pvalue


def test_verify_tree_sampling_follows_the_target():
    """The first token follows p, whichever tree was drafted; after a token the tree held, the
    next follows the target after that token (chi-square over 12,000 trees)."""
    vocab, trials = 5, 12_000
    generator = torch.Generator().manual_seed(1)
    target_probs = torch.rand(vocab + 1, vocab, generator=generator, dtype=torch.float64) + 0.05
    target_probs /= target_probs.sum(-1, keepdim=True)
    draft = torch.tensor([0.5, 0.05, 0.25, 0.15, 0.05], dtype=torch.float64)
    counts = _first_two_tokens(trials, target_probs, draft)
    assert _pvalue(counts.sum(1), target_probs[0].numpy()) > 1e-3
    went_on = counts[:, :vocab].sum(1)
    assert went_on.sum() > trials / 3 and counts[:, vocab].sum() > trials / 10
    for t in range(vocab):
        if went_on[t] >= 50:
            assert _pvalue(counts[t, :vocab], target_probs[1 + t].numpy()) > 1e-3, t


# -- through the engine ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_target():
    from test_engine_sampling import VOCAB

    return tiny_model("llama", vocab_size=VOCAB, seed=3)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t0.8-topk-topp"])
@pytest.mark.parametrize("kind", ["model", "model-dynamic", "dvi"])
def test_tree_sampled_output_follows_target(small_target, kind, sampling):
    runner = DecoderRunner(small_target)
    if kind == "model":
        drafter = ModelDrafter(DecoderRunner(perturbed(small_target, 1.0)), None, 3)
    elif kind == "model-dynamic":
        drafter = ModelDrafter(DecoderRunner(perturbed(small_target, 1.0)), topk=3, nodes=6)
    else:
        drafter = LayerSplitDrafter(
            runner, trained_head(runner, 3, std=0.1), share_cache=False, branches=3
        )
    engine = SpeculativeEngine(runner, TinyTokenizer(), drafter, ConstantPolicy(2), eos_ids=set())
    expected = exact_joint_distribution(small_target, sampling)
    assert chi_square_pvalue(engine, expected, sampling) > 1e-3


def test_tree_options_are_checked():
    class Loaded:
        runner = DecoderRunner(tiny_model("qwen2"))

    models = ModelPair(Loaded(), None)

    with pytest.raises(ConfigError, match="share_cache=0"):
        make_drafter("dvi", models, branches=2, share_cache="1")
    with pytest.raises(ConfigError, match="integer"):
        make_drafter("dvi", models, branches="two")
    with pytest.raises(ConfigError, match="branches must be >= 1"):
        make_drafter("dvi", models, branches=0)
    assert not make_drafter("dvi", models, branches=2).share_cache
    assert make_drafter("dvi", models).share_cache
    with pytest.raises(ConfigError, match="unknown option"):
        make_drafter("ngram", models, branches=2)


@pytest.mark.parametrize("topk,nodes", [(2, 5), (4, 16)])
def test_dynamic_model_trees_keep_greedy_output(topk, nodes):
    """EAGLE-2 trees grown by a draft model (several levels, each fed with an ancestor mask
    over the draft's cache): output equals plain decoding, more is accepted per step than by a
    chain of the same depth, and a batch's rows equal their single runs."""
    model = tiny_model("qwen2", dtype=torch.float64)
    draft = perturbed(model, 0.3)
    prompts = [[1, 5, 9, 14], [1, 40, 41], [1, 7, 7, 7, 7, 7, 8]]
    config = GenerationConfig(max_new_tokens=30)
    plain = SpeculativeEngine(DecoderRunner(model), TinyTokenizer(), eos_ids=set())
    expected = [plain.generate(p, config).token_ids for p in prompts]

    def engine(batch_size=1, **options):
        drafter = ModelDrafter(DecoderRunner(draft, batch_size=batch_size), **options)
        runner = DecoderRunner(model, batch_size=batch_size)
        return SpeculativeEngine(runner, TinyTokenizer(), drafter, ConstantPolicy(4), eos_ids=set())

    tree, chain = engine(topk=topk, nodes=nodes), engine()
    tree_mat = chain_mat = 0.0
    for prompt, want in zip(prompts, expected, strict=True):
        result = tree.generate(prompt, config)
        assert result.token_ids == want
        tree_mat += result.stats.mean_accepted_tokens
        chain_mat += chain.generate(prompt, config).stats.mean_accepted_tokens
    assert tree_mat > chain_mat
    batch = engine(batch_size=3, topk=topk, nodes=nodes).generate_batch(prompts, config)
    assert [r.token_ids for r in batch] == expected


def test_goodput_sized_model_trees_keep_greedy_output():
    """A draft model's trees sized per step from measured latency (TreeGoodputPolicy)."""
    model = tiny_model("qwen2", dtype=torch.float64)
    drafter = ModelDrafter(DecoderRunner(perturbed(model, 0.3)), topk=4, nodes=16)
    policy = TreeGoodputPolicy(depth=4, probe_every=3)
    engine = SpeculativeEngine(
        DecoderRunner(model), TinyTokenizer(), drafter, policy, eos_ids=set()
    )
    plain = SpeculativeEngine(DecoderRunner(model), TinyTokenizer(), eos_ids=set())
    config = GenerationConfig(max_new_tokens=30)
    nodes = set()
    for prompt in ([1, 5, 9, 14], [1, 40, 41], [1, 7, 7, 7, 7, 7, 8]):
        result = engine.generate(prompt, config)
        assert result.token_ids == plain.generate(prompt, config).token_ids
        nodes |= {record.num_nodes for record in result.stats.records}
    assert len(nodes) >= 3
