"""Bad input gets a clear error and a non-zero exit, before any expensive work."""

from __future__ import annotations

import json

import pytest
from tiny import TinyTokenizer, tiny_model

from specpilot.bench.run import BenchSettings
from specpilot.cli import build_parser, error_flags, main
from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.engine import SpeculativeEngine
from specpilot.errors import ConfigError, PromptError, SpecpilotError
from specpilot.methods import make_drafter, make_policy
from specpilot.models.chat import encode_prompt
from specpilot.models.decoder import DecoderRunner
from specpilot.models.pair import ModelPair
from specpilot.policies.sv import read_sv_profile
from specpilot.prompts import read_prompts_file


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err


def test_unknown_model_exits_nonzero(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, err = run_cli(
        capsys, "generate", "--target", "no-such-model-xyz", "--drafter", "none", "--prompt", "hi"
    )
    assert code == 2
    assert "unknown model 'no-such-model-xyz'" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--top-p", "0"], "top_p must be in (0, 1]"),
        (["--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
        (["--k", "0"], "k must be in 1..64"),
        (
            ["--policy", "heuristic", "--k", "3"],
            "unknown option 'k' for drafter 'model' and policy",
        ),
        (["--policy-option", "nonsense"], "KEY=VALUE"),
        (["--dtype", "int3"], "unknown dtype 'int3'"),
    ],
)
def test_invalid_config_values(capsys, argv, message, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, err = run_cli(
        capsys, "generate", "--prompt", "hi", "--target", "/nonexistent/x.gguf", *argv
    )
    assert code == 2
    assert message in err


def test_missing_prompt(capsys):
    code, err = run_cli(capsys, "generate")
    assert code == 2 and "--prompt" in err


def test_prompts_file_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "turns": ["ok"]}\nnot json\n')
    with pytest.raises(PromptError, match="bad.jsonl:2: not valid JSON"):
        read_prompts_file(bad)
    empty_turns = tmp_path / "empty.jsonl"
    empty_turns.write_text(json.dumps({"question_id": 1, "turns": [""]}) + "\n")
    with pytest.raises(PromptError, match="no usable prompt"):
        read_prompts_file(empty_turns)
    with pytest.raises(PromptError, match="not found"):
        read_prompts_file(tmp_path / "missing.jsonl")


def test_registry_errors():
    with pytest.raises(ConfigError, match="unknown policy 'magic'"):
        make_policy("magic")
    with pytest.raises(ConfigError, match="unknown option 'q'"):
        make_policy("constant", q="1")
    with pytest.raises(ConfigError, match="needs a draft model"):
        make_drafter("model", ModelPair(None, None))
    with pytest.raises(ConfigError):
        SamplingConfig(top_k=-1)


def test_empty_and_too_long_prompts():
    engine = SpeculativeEngine(DecoderRunner(tiny_model(), max_length=32), TinyTokenizer())
    with pytest.raises(PromptError, match="empty"):
        engine.generate([])
    with pytest.raises(PromptError, match="the prompt has 40 tokens but the context holds 32"):
        engine.generate(list(range(3, 43)))


def test_generation_stops_at_context_end():
    engine = SpeculativeEngine(
        DecoderRunner(tiny_model(), max_length=32), TinyTokenizer(), eos_ids=set()
    )
    result = engine.generate(list(range(3, 23)), GenerationConfig(max_new_tokens=50))
    assert result.finish_reason == "length"
    assert 20 + len(result.token_ids) == 32


@pytest.mark.parametrize(
    "make, options",
    [
        (lambda: read_sv_profile(None), ("sv_profile",)),
        (lambda: BenchSettings(prompts=("p.jsonl",), repeats=0), ("repeats",)),
        (lambda: encode_prompt(TinyTokenizer(), " "), ("prompt", "prompts_file")),
    ],
)
def test_api_errors_name_api_arguments_not_flags(make, options):
    """A Python caller reads the argument it passed, never the flag that sets it (a command to
    run, like `specpilot profile-sv --out PATH`, may still be quoted)."""
    with pytest.raises(SpecpilotError) as caught:
        make()
    message = str(caught.value)
    assert caught.value.options == options
    assert options[0] in message
    assert not any(f"--{option.replace('_', '-')}" in message for option in options)


def test_cli_appends_the_flags_of_the_command(capsys, monkeypatch):
    """The CLI adds the flag that sets each argument the error names, and only flags the
    failing command has."""
    import specpilot.cli.generate as generate

    def fail(args):
        raise ConfigError("SV needs an acceptance profile (sv_profile)", ("sv_profile", "nothing"))

    monkeypatch.setattr(generate, "run", fail)
    code, err = run_cli(capsys, "generate", "--prompt", "hi")
    assert code == 2
    assert err == "error: SV needs an acceptance profile (sv_profile) (--sv-profile)\n"


def test_cli_prints_a_core_error_with_its_flag(capsys):
    code, err = run_cli(capsys, "bench", "--prompts", "p.jsonl", "--repeats", "0")
    assert code == 2
    assert err.strip() == "error: repeats must be >= 1, got 0 (--repeats)"


def test_error_without_options_prints_its_message_only(capsys, monkeypatch):
    import specpilot.cli.generate as generate

    def fail(args):
        raise ConfigError("plain")

    monkeypatch.setattr(generate, "run", fail)
    assert run_cli(capsys, "generate", "--prompt", "hi") == (2, "error: plain\n")
    assert error_flags(ConfigError("m", ("no_such_option",)), build_parser()) == []
