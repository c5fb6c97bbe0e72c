"""How far a generation runs by default: to EOS, at most 1024 new tokens, and never past the
context, which ends it cleanly with finish_reason "length" (plain, chain and tree drafting)."""

from __future__ import annotations

import json

import pytest
from tiny import TinyTokenizer, perturbed, save_tiny, tiny_model

from specpilot.cli import build_parser, main
from specpilot.config import GenerationConfig
from specpilot.drafting import ModelDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.models.decoder import DecoderRunner
from specpilot.policies import ConstantPolicy

PROMPT = list(range(3, 13))


def test_the_default_runs_up_to_1024_new_tokens():
    model = tiny_model()
    model.config.max_position_embeddings = 2048  # room for more than 1024 new tokens
    engine = SpeculativeEngine(
        DecoderRunner(model, max_length=2048), TinyTokenizer(), eos_ids=set()
    )
    result = engine.generate(PROMPT)
    assert GenerationConfig().max_new_tokens == 1024
    assert len(result.token_ids) == 1024 and result.finish_reason == "length"


def test_the_default_stops_at_eos():
    engine = SpeculativeEngine(DecoderRunner(tiny_model(), max_length=64), TinyTokenizer())
    free = engine.generate(PROMPT, GenerationConfig(stop_on_eos=False))
    eos = free.token_ids[5]
    engine.eos_ids = frozenset({eos})
    result = engine.generate(PROMPT)
    assert result.finish_reason == "eos"
    assert result.token_ids == free.token_ids[: free.token_ids.index(eos) + 1]


@pytest.mark.parametrize("branches", [None, 1, 3], ids=["plain", "chain", "tree"])
def test_the_default_stops_cleanly_at_the_context_end(branches):
    model = tiny_model()
    target = DecoderRunner(model, max_length=48)
    drafter = None
    if branches is not None:
        draft = DecoderRunner(perturbed(model, 0.3), max_length=48)
        drafter = ModelDrafter(draft, branches=branches)
    engine = SpeculativeEngine(
        target, TinyTokenizer(), drafter, ConstantPolicy(4), eos_ids=frozenset()
    )
    result = engine.generate(PROMPT)
    plain = SpeculativeEngine(DecoderRunner(model, max_length=48), TinyTokenizer(), eos_ids=set())
    assert result.finish_reason == "length"
    assert len(PROMPT) + len(result.token_ids) == 48
    assert result.token_ids == plain.generate(PROMPT).token_ids


def test_generate_defaults_to_1024_and_says_so(capsys, tmp_path):
    assert build_parser().parse_args(["generate"]).max_new_tokens == 1024
    assert build_parser().parse_args(["bench"]).max_new_tokens == 128
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(default 1024); an answer ends earlier at the end-of-sequence token" in help_text
    target = save_tiny(tmp_path / "target", seed=0)
    argv = ["generate", "--target", str(target), "--drafter", "none", "--prompt", "w5 w6"]
    assert main([*argv, "--dtype", "float32", "--max-length", "40", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert answer["finish_reason"] in ("eos", "length")
    assert 0 < len(answer["token_ids"]) < 40
