"""The lean decoder runner reproduces transformers' logits and handles its cache correctly."""

import pytest
import torch
from tiny import tiny_model

from specpilot.models.decoder import DecoderRunner


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids], device=model.device)).logits[0]


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("tie", [False, True])
def test_logits_match_transformers(kind, tie):
    model = tiny_model(kind, tie=tie)
    runner = DecoderRunner(model)
    ids = torch.randint(0, 96, (23,), generator=torch.Generator().manual_seed(1)).tolist()
    expected = hf_logits(model, ids)
    # Prefill in uneven chunks, then single tokens: every path must agree with one full forward.
    chunks = [ids[:7], ids[7:8], ids[8:15], ids[15:16], ids[16:17], ids[17:]]
    got = torch.cat([runner.forward(chunk) for chunk in chunks])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_rollback_and_garbage_past_end():
    model = tiny_model("qwen2")
    runner = DecoderRunner(model)
    ids = list(range(3, 20))
    expected = hf_logits(model, ids)
    runner.forward(ids[:10])
    runner.forward([50, 51, 52, 53])  # garbage appended, then rolled back
    runner.rollback(10)
    assert runner.length == 10
    got = runner.forward(ids[10:])
    torch.testing.assert_close(got, expected[10:], rtol=1e-5, atol=1e-5)


def test_layer_split_and_taps_equal_full_forward():
    model = tiny_model("llama")
    full = DecoderRunner(model)
    split = DecoderRunner(model)
    ids = list(range(5, 17))
    out_full = full.run(ids, tap_layers=(2,))
    shallow = split.run(ids, end_layer=2, logits="none")
    deep = split.run(hidden=shallow.hidden, start_layer=2)
    torch.testing.assert_close(shallow.hidden, out_full.taps[2])
    torch.testing.assert_close(deep.logits, out_full.logits)
    assert split.lengths == [12] * 4


def test_tree_mask_matches_separate_branches():
    """Two sibling branches verified in one forward equal each branch run alone."""
    model = tiny_model("qwen2")
    prefix, a, b = [4, 5, 6], [7, 8], [9, 10]
    tree = DecoderRunner(model)
    tree.forward(prefix)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
    positions = torch.tensor([3, 4, 3, 4])
    got = tree.run(a + b, position_ids=positions, tree_mask=mask).logits
    torch.testing.assert_close(got[:2], hf_logits(model, prefix + a)[3:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2:], hf_logits(model, prefix + b)[3:], rtol=1e-5, atol=1e-5)
