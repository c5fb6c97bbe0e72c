"""`specpilot export-head` and `import-head` end to end: a head saved for a tiny target folder
goes out in the EAGLE-3 format and comes back with identical weights; a head the target
cannot run is refused with one `error:` line."""

from __future__ import annotations

import json

import torch
from eagle_fixtures import tiny_head
from tiny import save_tiny

from specpilot.api import load_models
from specpilot.cli import main
from specpilot.drafting.eagle_head import EagleHead


def test_export_then_import_gives_the_same_head(tmp_path, capsys):
    target = save_tiny(tmp_path / "target", seed=0)
    runner = load_models(str(target), None, "float32", backend="torch").target.runner
    head = tiny_head(runner, draft_vocab=40).float()
    head.save(tmp_path / "head", torch.float32)
    out = tmp_path / "eagle3"
    argv = ["export-head", "--target", str(target), "--eagle-head", str(tmp_path / "head")]
    assert main([*argv, "--format", "eagle3", "--out", str(out), "--dtype", "float32"]) == 0
    assert "vLLM only" in capsys.readouterr().out  # a Qwen-initialised head keeps its bias
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == 40
    back = tmp_path / "back"
    argv = ["import-head", str(out), "--target", str(target), "--out", str(back)]
    assert main([*argv, "--dtype", "float32"]) == 0
    mine, theirs = head.state_dict(), EagleHead.load(back).state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine) and mine.keys() == theirs.keys()

    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    assert main([*argv, "--dtype", "float32"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == ["error: cannot import this EAGLE-3 head: it has 3 decoder layers; "
                     "specpilot runs one"]  # fmt: skip
