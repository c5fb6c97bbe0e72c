"""Eagle head folders: round trip, and one clear error for every way a head can be wrong."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from eagle_fixtures import WORDS, tiny_head, tiny_target
from tiny import tiny_tokenizer

from specpilot.drafting import eagle_head
from specpilot.drafting.dynamic_tree import DynamicTree
from specpilot.drafting.eagle_head import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    EagleHead,
    EagleShape,
    mlp_units,
    resolve_head,
)
from specpilot.errors import ConfigError
from specpilot.models.decoder import DecoderRunner
from specpilot.tree import tree_depths


@pytest.fixture(scope="module")
def runner():
    return DecoderRunner(tiny_target(torch.float32))


def test_round_trip_in_bf16(runner, tmp_path):
    head = tiny_head(runner, draft_vocab=40)
    head.save(tmp_path / "head")
    loaded = EagleHead.load(tmp_path / "head", expected=head.shape)
    assert loaded.shape == head.shape
    assert torch.equal(loaded.draft_ids, head.draft_ids)
    torch.testing.assert_close(loaded.qkv, head.qkv.bfloat16().float())
    assert resolve_head(tmp_path, "x") == tmp_path / "head"  # a train-eagle --out folder


@pytest.mark.parametrize(
    "field,value,named",
    [
        ("hidden_size", 128, "hidden_size"),
        ("vocab_size", 151936, "vocab_size"),
        ("num_layers", 28, "num_layers"),
        ("tokenizer_fingerprint", "0123", "tokenizer"),
    ],
)
def test_head_for_another_target_is_refused(runner, tmp_path, field, value, named):
    head = tiny_head(runner)
    head.save(tmp_path / "head")
    other = dataclasses.replace(head.shape, **{field: value})
    with pytest.raises(ConfigError, match=f"another target.*{named}"):
        EagleHead.load(tmp_path / "head", expected=other)


def test_missing_and_corrupt_heads(runner, tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        resolve_head(tmp_path / "nope", "x")
    with pytest.raises(ConfigError, match="no eagle head committed.*train-eagle"):
        resolve_head(None, "no-such-target")
    with pytest.raises(ConfigError, match="not an eagle head folder"):
        EagleHead.load(tmp_path)
    head = tiny_head(runner)
    head.save(tmp_path / "head")
    (tmp_path / "head" / WEIGHTS_FILE).write_bytes(b"garbage")
    with pytest.raises(ConfigError, match="corrupt"):
        EagleHead.load(tmp_path / "head")
    head.save(tmp_path / "head")
    meta = json.loads((tmp_path / "head" / CONFIG_FILE).read_text())
    (tmp_path / "head" / CONFIG_FILE).write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(ConfigError, match="format"):
        EagleHead.load(tmp_path / "head")


def test_committed_heads_resolve_by_name(runner, tmp_path, monkeypatch):
    """`--eagle-head ppow` is the head committed beside the target's own (heads/<target>-ppow);
    a path or a train-ppow --out folder still wins, and an unknown name lists the known ones."""
    monkeypatch.setattr(
        eagle_head, "HEADS", dataclasses.replace(eagle_head.HEADS, committed=tmp_path / "heads")
    )
    head = tiny_head(runner)
    head.save(tmp_path / "heads" / "tiny")
    head.save(tmp_path / "heads" / "tiny-ppow")
    assert resolve_head(None, "tiny") == tmp_path / "heads" / "tiny"
    assert resolve_head("ppow", "tiny") == tmp_path / "heads" / "tiny-ppow"
    head.save(tmp_path / "run" / "head")
    assert resolve_head(tmp_path / "run", "tiny") == tmp_path / "run" / "head"
    with pytest.raises(ConfigError, match="committed names: ppow"):
        resolve_head("distill", "tiny")
    with pytest.raises(ConfigError, match="not found"):
        resolve_head("./ppow", "tiny")


def test_dynamic_tree_keeps_the_best_nodes_with_their_ancestors():
    tree = DynamicTree(topk=2, nodes=5)
    tree.expand(torch.log(torch.tensor([[0.6, 0.3, 0.1]])))
    assert [tree.tokens[i] for i in tree.frontier] == [0, 1]
    # children of token 0 (p 0.6): 0.9, 0.1; of token 1 (p 0.3): 0.5, 0.5
    tree.expand(torch.log(torch.tensor([[0.9, 0.1, 0.0], [0.5, 0.5, 0.0]])))
    tokens, parents = tree.select()
    tree_depths(parents)  # parents precede children
    # best path first: 0 (0.6) → 0 (0.54); then 1 (0.3), 1→0 (0.15), 1→1 (0.15)
    assert tokens == [0, 0, 1, 0, 1] and parents == (-1, 0, -1, 2, 2)


def test_a_narrower_head_starts_from_the_targets_strongest_mlp_units(runner, tmp_path):
    """A head may be narrower than the target's MLP (to fit a large target's head in 100 MB);
    it keeps the units that move the output most and still loads for the same target."""
    tokenizer = tiny_tokenizer(WORDS[: runner.vocab_size - 4])
    full = EagleShape.for_target(runner, tokenizer)
    width = full.intermediate_size // 2
    shape = EagleShape.for_target(runner, tokenizer, intermediate_size=width)
    head = EagleHead(shape, torch.arange(runner.vocab_size))
    head.init_from_target(runner)
    last = runner.layers[-1]
    units = mlp_units(last, width)
    assert units.numel() == width and bool((units[1:] > units[:-1]).all())
    torch.testing.assert_close(head.down, last.down[:, units].float().cpu())
    assert head.gate_up.shape == (2 * width, shape.hidden_size)
    assert shape.mismatch(full) is None  # the MLP width is the head's own choice
    head.save(tmp_path / "head")
    assert EagleHead.load(tmp_path / "head", expected=full).shape.intermediate_size == width
