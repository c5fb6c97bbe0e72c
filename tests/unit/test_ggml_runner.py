"""The ggml runner against the torch runner on the same float32 weights (fixtures/gguf_fixtures):
logits, early exits, multi-token against one-token forwards, rollback and prefix reuse,
independent slots, draft-tree nodes against their branch fed as a chain, and refused forwards
leaving the cache."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

import torch  # noqa: E402
from gguf_fixtures import ggml_runner  # noqa: E402
from tiny import tiny_model  # noqa: E402

from specpilot.errors import PromptError  # noqa: E402
from specpilot.models.decoder import DecoderRunner  # noqa: E402

TOL = dict(rtol=1e-5, atol=2e-5)
PROMPT = [1, 3, 10, 50, 95, 7, 22, 40]


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen2", vocab_size=96)


@pytest.fixture(scope="module")
def gguf(model, tmp_path_factory):
    return tmp_path_factory.mktemp("ggml") / "tiny.gguf"


@pytest.fixture
def runner(model, gguf):
    return ggml_runner(model, gguf, batch_size=3)


def test_logits_equal_the_torch_runner(model, runner):
    assert runner.backend == "ggml" and runner.vocab_size == 96
    torch.testing.assert_close(runner.forward(PROMPT), DecoderRunner(model).forward(PROMPT), **TOL)
    last = runner.forward([5, 6], logits="last")
    reference = DecoderRunner(model)
    reference.forward(PROMPT, logits="none")
    torch.testing.assert_close(last, reference.forward([5, 6])[-1:], **TOL)
    assert runner.forward([9], logits="none") is None and runner.length == len(PROMPT) + 3


def test_early_exit_equals_the_torch_early_exit(model, runner, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path))
    exit_runner = runner.early_exit(1)
    assert exit_runner.num_layers == 1 and exit_runner.path.parent.parent.parent == tmp_path
    expected = DecoderRunner(model).early_exit(1).forward(PROMPT)
    torch.testing.assert_close(exit_runner.forward(PROMPT), expected, **TOL)
    written = exit_runner.path.stat().st_mtime_ns
    assert runner.early_exit(1).path.stat().st_mtime_ns == written  # written once
    with pytest.raises(ValueError, match="early exit needs 1.."):
        runner.early_exit(runner.num_layers + 1)


def test_multi_token_forward_equals_one_token_forwards(runner):
    together = runner.forward(PROMPT)
    runner.reset()
    alone = torch.cat([runner.forward([token]) for token in PROMPT])
    torch.testing.assert_close(together, alone, **TOL)


def test_rollback_and_prefix_reuse(runner):
    full = runner.forward(PROMPT)
    runner.cached.add(0, PROMPT)
    runner.rollback(3)
    assert runner.length == 3 and runner.cached.slots[0] == PROMPT[:3]
    torch.testing.assert_close(runner.forward(PROMPT[3:]), full[3:], **TOL)
    runner.rollback(5)
    other = runner.forward([60, 61])  # a different continuation after a shared prefix
    fresh = ggml_runner(*_same(runner))
    torch.testing.assert_close(other, fresh.forward([*PROMPT[:5], 60, 61])[5:], **TOL)


def _same(runner):
    """The arguments that rebuild `runner`'s model (a fresh cache)."""
    return tiny_model("qwen2", vocab_size=96), runner.path


def test_slots_are_independent(runner):
    rows = [PROMPT, [1, 4, 4, 4], [1, 90]]
    batched = runner.forward_batch(rows, [2, 0, 1], "all")
    for row, logits in zip(rows, batched, strict=True):
        single = ggml_runner(*_same(runner))
        torch.testing.assert_close(logits, single.forward(row), **TOL)
    runner.rollback(1, slot=0)  # one slot's rollback leaves the others as they were
    more = runner.forward_batch([[7], [8]], [0, 2], "last")
    torch.testing.assert_close(
        more[1], ggml_runner(*_same(runner)).forward(PROMPT + [8])[-1:], **TOL
    )
    torch.testing.assert_close(more[0], ggml_runner(*_same(runner)).forward([1, 7])[-1:], **TOL)


PARENTS = (-1, 0, 0, -1, 3, 1, 1)  # two subtrees below the root, siblings at two depths
TREE = [40, 11, 12, 13, 14, 15, 16, 17]  # root, then nodes 0..6


def _branch(node: int) -> list[int]:
    path = []
    while node >= 0:
        path.insert(0, node)
        node = PARENTS[node]
    return path


def test_tree_nodes_equal_their_branch_as_a_chain(runner):
    runner.forward(PROMPT[:-1], logits="none")
    scored = runner.forward_batch([TREE], [0], "all", trees=[PARENTS])[0]
    for node in range(len(PARENTS)):
        chain = ggml_runner(*_same(runner))
        chain.forward(PROMPT[:-1], logits="none")
        expected = chain.forward([TREE[0], *(TREE[1 + i] for i in _branch(node))])
        torch.testing.assert_close(scored[1 + node], expected[-1], **TOL)
        torch.testing.assert_close(scored[0], expected[0], **TOL)


def test_keep_path_leaves_the_accepted_branch_as_a_chain(runner):
    start = len(PROMPT) - 1
    runner.forward(PROMPT[:-1], logits="none")
    runner.forward_batch([TREE], [0], "all", trees=[PARENTS])
    path = (0, 1)  # node 1 is node 0's child
    runner.keep_path(0, start, path)
    runner.rollback(start + 1 + len(path))
    assert runner.length == start + 3
    after = runner.forward([70, 71])
    chain = ggml_runner(*_same(runner))
    expected = chain.forward([*PROMPT[:-1], TREE[0], TREE[1], TREE[2], 70, 71])[-2:]
    torch.testing.assert_close(after, expected, **TOL)
    # The released tree's ids serve the next tree.
    runner.forward_batch([TREE], [0], "all", trees=[PARENTS])
    runner.rollback(runner.length)


def test_tree_and_chain_rows_in_one_forward(runner):
    runner.forward_batch([PROMPT[:-1], [1, 4, 4]], [0, 1], "none")
    tree_logits, chain_logits = runner.forward_batch(
        [TREE, [5, 6]], [0, 1], "all", trees=[PARENTS, None]
    )
    single = ggml_runner(*_same(runner))
    single.forward(PROMPT[:-1], logits="none")
    torch.testing.assert_close(
        tree_logits, single.forward_batch([TREE], [0], "all", trees=[PARENTS])[0], **TOL
    )
    other = ggml_runner(*_same(runner)).forward([1, 4, 4, 5, 6])[-2:]
    torch.testing.assert_close(chain_logits, other, **TOL)


def test_refused_forwards_leave_the_cache(runner):
    runner.forward(PROMPT, logits="none")
    with pytest.raises(PromptError, match="exceeds the context"):
        runner.forward_batch([[5], [5] * 300], [0, 1], "all")
    with pytest.raises(ValueError, match="token ids"):
        runner.forward_batch([[5], [96]], [0, 1], "all")
    with pytest.raises(ValueError, match="distinct"):
        runner.forward_batch([[5], [6]], [0, 0], "all")
    assert runner.lengths == [len(PROMPT), 0, 0]
    expected = ggml_runner(*_same(runner)).forward([*PROMPT, 5])[-1:]
    torch.testing.assert_close(runner.forward([5], logits="last"), expected, **TOL)
