"""Loading on the ggml backend: a .gguf read as stored with the tokenizer of its metadata, the
`auto` choice by method, and `generate` on ggml giving plain ggml decoding's text (eagle and SV
too)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llama_cpp")

import torch  # noqa: E402
from gguf_fixtures import EXACT, write_tiny_qwen2_gguf  # noqa: E402
from tiny import tiny_model  # noqa: E402

from specpilot.cli import main  # noqa: E402
from specpilot.drafting.eagle_head import HEADS, EagleHead, EagleShape  # noqa: E402
from specpilot.methods.defaults import default_drafter  # noqa: E402
from specpilot.models import load_model  # noqa: E402
from specpilot.models.backends import choose_backend, runs_on_ggml  # noqa: E402
from specpilot.models.decoder import DecoderRunner  # noqa: E402
from specpilot.models.ggml import GgmlRunner  # noqa: E402


@pytest.fixture
def gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "cache"))
    model = tiny_model("qwen2", vocab_size=96)
    write_tiny_qwen2_gguf(tmp_path / "tiny.gguf", model)
    return model, tmp_path / "tiny.gguf"


def test_gguf_loads_as_stored(gguf):
    model, path = gguf
    loaded = load_model(str(path), backend="ggml", ggml=EXACT, max_length=128)
    assert isinstance(loaded.runner, GgmlRunner) and loaded.runner.backend == "ggml"
    assert loaded.tokenizer.eos_token_id == 2 and loaded.tokenizer.convert_ids_to_tokens(3) == "ab"
    assert loaded.config.num_hidden_layers == 4
    ids = [1, 3, 10, 50]
    expected = DecoderRunner(model).forward(ids)
    torch.testing.assert_close(loaded.runner.forward(ids), expected, rtol=1e-5, atol=2e-5)


def test_auto_picks_ggml_where_the_method_runs_there(gguf):
    _, path = gguf
    assert runs_on_ggml("model", "goodput") and runs_on_ggml("ngram", "constant")
    assert runs_on_ggml("model", None, {"branches": 3})
    assert runs_on_ggml("eagle", None) and runs_on_ggml("eagle", "tree-goodput", {"tree_topk": 4})
    assert runs_on_ggml("eagle", "ltd") and runs_on_ggml("model", "sv")
    assert runs_on_ggml("model", "goodput", {"companion": "early-exit:target:2"})
    for drafter, policy, options in [
        ("dvi", "constant", {}),
        ("model", "ltd", {}),
        ("model", "tree-goodput", {}),
        ("model", None, {"tree_topk": 4}),
        ("model", None, {"draft_vocab": 48}),
    ]:
        assert not runs_on_ggml(drafter, policy, options), (drafter, policy, options)
    assert choose_backend("auto", str(path), "cpu", True) == "ggml"
    assert choose_backend("auto", str(path), "cpu", False) == "auto"
    assert choose_backend("auto", str(path.parent), "cpu", True) == "auto"  # not a GGUF
    assert choose_backend("auto", str(path), "cuda", True) == "auto"
    assert choose_backend("torch", str(path), "cpu", True) == "torch"


def test_generate_on_ggml_gives_plain_decodings_text(gguf, capsys):
    _, path = gguf
    common = ["generate", "--target", str(path), "--prompt", "ab!", "--max-new-tokens", "12"]
    outputs = []
    for extra in (
        ["--drafter", "none"],
        ["--drafter", "ngram", "--k", "3", "--policy", "constant"],
    ):
        assert main([*common, "--backend", "ggml", *extra]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].strip()


def test_generate_with_eagle_on_ggml_gives_plain_decodings_text(gguf, tmp_path, capsys):
    """`auto` runs eagle on ggml (chains and dynamic trees): the head is built for the GGUF's
    config and tokenizer, and reads the GGUF's embedding rows."""
    _, path = gguf
    loaded = load_model(str(path), backend="ggml", ggml=EXACT, max_length=128)
    config, runner = loaded.config, loaded.runner
    shape = EagleShape.for_config(config, runner.vocab_size, loaded.tokenizer, True, (1, 2))
    EagleHead(shape, torch.arange(shape.draft_vocab_size)).save(tmp_path / "head")
    common = ["generate", "--target", str(path), "--prompt", "ab!", "--max-new-tokens", "12"]
    outputs = []
    for extra in (
        ["--drafter", "none"],
        ["--drafter", "eagle", "--tree-topk", "1", "--policy", "constant"],
        ["--drafter", "eagle", "--tree-topk", "3"],
    ):
        eagle = ["--eagle-head", str(tmp_path / "head")] if "eagle" in extra else []
        assert main([*common, "--backend", "auto", *extra, *eagle]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2] and outputs[0].strip()
    assert not (tmp_path / "cache" / "models").exists()  # no torch conversion: auto ran ggml


def test_a_head_installed_for_the_target_drafts_by_default(gguf, capsys):
    """With no --drafter, a target with a head (here installed in the cache, as import-head does)
    decodes with the eagle drafter under the goodput controller on ggml; the JSON says so, and
    the text is plain decoding's."""
    _, path = gguf
    loaded = load_model(str(path), backend="ggml", ggml=EXACT, max_length=128)
    config, runner = loaded.config, loaded.runner
    shape = EagleShape.for_config(config, runner.vocab_size, loaded.tokenizer, True, (1, 2))
    argv = ["generate", "--target", str(path), "--prompt", "ab!", "--max-new-tokens", "12"]
    assert default_drafter(str(path)) == "model"  # no head yet: the draft model's default
    EagleHead(shape, torch.arange(shape.draft_vocab_size)).save(HEADS.installed(str(path)))
    assert main([*argv, "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert default["method"] == "sd:drafter=eagle,policy=goodput"
    assert main([*argv, "--json", "--drafter", "none"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == default["token_ids"]


def test_sv_profiles_and_decodes_on_ggml(gguf, tmp_path, capsys):
    """profile-sv and `--policy sv` pick ggml for a GGUF (the companion an early exit written as
    a GGUF); the text is plain decoding's, and a profile is refused on the other backend."""
    _, path = gguf
    models = ["--target", str(path), "--draft", str(path), "--max-new-tokens", "12"]
    profile = tmp_path / "sv.json"
    command = ["profile-sv", *models, "--companion", "early-exit:target:2", "--max-verify", "4"]
    assert main([*command, "--min-count", "2", "--out", str(profile), "--quiet"]) == 0
    saved = json.loads(profile.read_text())
    assert saved["backend"] == "ggml" and saved["records"] > 0
    capsys.readouterr()
    generate = ["generate", *models, "--prompt", "ab!", "--json"]
    assert main([*generate, "--drafter", "none"]) == 0
    plain = json.loads(capsys.readouterr().out)["token_ids"]
    assert main([*generate, "--policy", "sv", "--sv-profile", str(profile)]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == plain
    assert main([*generate, "--policy", "sv", "--sv-profile", str(profile), "--backend", "torch"])
    assert "profiled on the ggml backend" in capsys.readouterr().err


def test_a_method_that_needs_torch_is_refused_on_ggml(gguf, capsys):
    _, path = gguf
    argv = ["generate", "--target", str(path), "--prompt", "ab!", "--backend", "ggml"]
    assert main([*argv, "--drafter", "dvi"]) == 2
    error = capsys.readouterr().err
    assert "drafter=dvi" in error and "ggml backend does not expose" in error
    assert "(--backend)" in error
