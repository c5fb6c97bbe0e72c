"""Goodput-sized trees: the verified size follows the measured latency curve and the draft's
calibrated confidence; the opening sweep and re-probes measure the curve; requests share it."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from specpilot.drafting.dynamic_tree import DynamicTree
from specpilot.errors import ConfigError
from specpilot.methods import make_policy
from specpilot.policies.tree_goodput import TreeGoodputPolicy
from specpilot.types import StepRecord


def grown_tree(nodes: int = 8) -> DynamicTree:
    """Two levels of a top-4 tree whose best paths are likely (0.9, then 0.8 under it)."""
    tree = DynamicTree(topk=4, nodes=nodes)
    first = torch.tensor([[0.9, 0.05, 0.03, 0.02] + [0.0] * 4]).clamp_min(1e-9).log()
    tree.expand(first)
    second = torch.tensor([[0.8, 0.1, 0.06, 0.04] + [0.0] * 4] * 4).clamp_min(1e-9).log()
    tree.expand(second)
    return tree


def record(nodes: int, verify_s: float, accepted: int = 1) -> StepRecord:
    return StepRecord(
        num_drafted=2, num_verified=2, num_accepted=accepted, num_emitted=accepted + 1,
        draft_s=0.01, verify_s=verify_s, context_len=100, num_nodes=nodes,
    )  # fmt: skip


def learned(policy: TreeGoodputPolicy, latency, steps: int = 40) -> TreeGoodputPolicy:
    """`policy` after `steps` steps of its own choices on a machine with T(n) = latency(n)."""
    tree = grown_tree()
    for _ in range(steps):
        size = policy.tree_size(tree, 100)
        policy.observe(record(size, latency(size + 1)))
    return policy


def test_the_opening_sweep_measures_a_spread_of_sizes():
    policy, tree = TreeGoodputPolicy(), grown_tree()
    chosen = []
    for _ in range(5):
        chosen.append(policy.tree_size(tree, 100))
        policy.observe(record(chosen[-1], 0.1))
    assert chosen[:4] == [1, 2, 4, 8]


def test_a_steep_curve_verifies_few_nodes_and_a_flat_one_all():
    steep = learned(TreeGoodputPolicy(), lambda n: 0.1 * n)  # float32 on an AVX2 CPU, roughly
    flat = learned(TreeGoodputPolicy(), lambda n: 0.1 + 0.0001 * n)  # bf16 with AMX, roughly
    tree = grown_tree()
    assert steep.best_size(sorted_confidence(tree)) <= 2
    assert flat.best_size(sorted_confidence(tree)) == 8


def sorted_confidence(tree: DynamicTree) -> list[float]:
    return sorted((math.exp(s) for s in tree.scores), reverse=True)[: tree.nodes]


def test_calibration_follows_accepted_lengths():
    policy, tree = TreeGoodputPolicy(), grown_tree()
    for _ in range(30):
        size = policy.tree_size(tree, 100)
        policy.observe(record(size, 0.1, accepted=0))
    assert policy.measured.calibration() < 0.3  # the draft was trusted, then nothing was taken


def test_requests_share_what_is_learned():
    policy = learned(TreeGoodputPolicy(), lambda n: 0.1 * n, steps=10)
    request = copy.deepcopy(policy)
    assert request.measured is policy.measured and request.predicted is None


def test_probes_keep_measuring_next_to_the_best_size():
    policy = learned(TreeGoodputPolicy(probe_every=4), lambda n: 0.1 * n)
    tree = grown_tree()
    sizes = []
    for _ in range(16):
        sizes.append(policy.tree_size(tree, 100))
        policy.observe(record(sizes[-1], 0.1 * (sizes[-1] + 1)))
    best = min(sizes)
    assert set(sizes) >= {best, best + 1}


@pytest.mark.parametrize(
    "options", [{"depth": "0"}, {"min_nodes": "0"}, {"probe_every": "1"}, {"memory": "1.5"}]
)
def test_bad_options_are_named(options):
    with pytest.raises(ConfigError, match=next(iter(options))):
        make_policy("tree-goodput", **options)


def test_only_tree_drafters_are_accepted():
    policy = TreeGoodputPolicy(depth=5)
    assert policy.drafter_options("eagle", {}) == {"tree_depth": 5}
    assert policy.drafter_options("eagle", {"tree_depth": 3}) == {"tree_depth": 3}
    assert policy.draft_budget() == 3  # the drafter's given depth is not capped by the budget
    with pytest.raises(ConfigError, match="depth"):
        policy.drafter_options("eagle", {"tree_depth": 0})
    assert policy.drafter_options("model", {"tree_nodes": 4}) == {"tree_nodes": 4}
    with pytest.raises(ConfigError, match="tree-goodput"):
        policy.drafter_options("ngram", {})


def run_steps(policy: TreeGoodputPolicy, accepted, draft_s: float, steps: int = 60) -> list[int]:
    """Depths `policy` drafts over `steps` steps of a head whose step of d levels accepts
    accepted(d) and costs draft_s · d, on a curve T(n) = 0.1 + 0.001 n."""
    depths = []
    for _ in range(steps):
        depth = policy.draft_budget()
        tree = DynamicTree(topk=4, nodes=8)
        probs = torch.tensor([[0.6, 0.2, 0.1, 0.1] + [0.0] * 4]).clamp_min(1e-9).log()
        for level in range(depth):
            tree.expand(probs if level == 0 else probs.expand(4, -1))
        size = policy.tree_size(tree, 100)
        depths.append(depth)
        policy.observe(
            StepRecord(
                num_drafted=depth,
                num_verified=depth,
                num_accepted=accepted(depth),
                num_emitted=accepted(depth) + 1,
                draft_s=draft_s * depth,
                verify_s=0.1 + 0.001 * (size + 1),
                context_len=100,
                num_nodes=size,
            )  # fmt: skip
        )
    return depths


def test_the_depth_follows_what_deeper_levels_bring_and_cost():
    """A head whose levels past the first are never accepted drafts one level once the opening
    steps have measured it, except the periodic full-depth probes; one whose every level is
    accepted keeps the full depth; adapt_depth=False always drafts `depth`."""
    shallow = run_steps(TreeGoodputPolicy(depth=3, probe_every=8), lambda d: 1, draft_s=0.01)
    assert shallow[:8] == [3] * 8
    later = shallow[8:]
    assert later.count(1) >= len(later) - len(later) // 8 - 1
    assert all(d in (1, 3) for d in later) and 3 in later  # the probes keep level 3 measured
    deep = run_steps(TreeGoodputPolicy(depth=3, probe_every=8), lambda d: d, draft_s=0.01)
    assert deep[8:].count(3) == len(deep) - 8
    fixed = run_steps(TreeGoodputPolicy(depth=3, adapt_depth=False), lambda d: 1, draft_s=0.01)
    assert set(fixed) == {3}
