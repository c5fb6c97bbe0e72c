"""MethodSpec: CLI flags, bench strings and API keywords give one spec; names and options are
checked when it is made; defaults come from methods.defaults; the bench's `default` is what
`generate` runs with no method flags."""

from __future__ import annotations

import argparse

import pytest
import torch

from specpilot.bench.methods import parse_method
from specpilot.cli.common import add_method_arguments, add_model_arguments, method_spec
from specpilot.errors import ConfigError
from specpilot.methods import DRAFTERS, POLICIES, MethodSpec
from specpilot.methods.defaults import (
    DEFAULT_TARGET,
    EAGLE_BF16_LOOKUP,
    HEADLESS_DRAFTER,
    default_drafter,
)


def flags(*argv: str) -> MethodSpec:
    parser = argparse.ArgumentParser()
    add_model_arguments(parser, max_new_tokens=8)
    add_method_arguments(parser)
    return method_spec(parser.parse_args(argv))


def test_flags_bench_strings_and_keywords_give_equal_specs():
    by_flags = flags("--drafter", "eagle", "--tree-depth", "4", "--eagle-head", "ppow")
    by_string = MethodSpec.parse("sd:drafter=eagle,tree_depth=4,eagle_head=ppow")
    by_keywords = MethodSpec.of("eagle", tree_depth=4, eagle_head="ppow")
    assert by_flags == by_string == by_keywords
    assert by_keywords.option("tree_depth") == 4  # converted to the declared type
    sv = MethodSpec.of("model", "constant", k=2, draft_vocab=64)
    assert (
        flags("--drafter", "model", "--policy", "constant", "--k", "2", "--draft-vocab", "64") == sv
    )
    assert MethodSpec.parse(str(sv)) == sv
    assert sv.drafter_options == {"draft_vocab": 64} and sv.policy_options == {"k": 2}


def test_the_bench_default_is_what_generate_runs():
    drafter = default_drafter(DEFAULT_TARGET)
    assert drafter == "eagle"  # the default target has a committed head
    assert parse_method("default").spec == flags() == MethodSpec.of(drafter)
    # `sd` without a policy gets the same default policy as generate (not constant).
    assert parse_method("sd").spec == flags()
    assert parse_method("ar").spec == MethodSpec.of("none", "constant", k=1)
    # A target without a head drafts with the draft model, in every front end.
    headless = "some/model.gguf"
    assert default_drafter(headless) == HEADLESS_DRAFTER == "model"
    assert parse_method("default", headless).spec == flags("--target", headless)
    assert flags("--target", headless) == MethodSpec.of("model")


def test_a_head_installed_in_the_cache_makes_eagle_the_default(tmp_path, monkeypatch):
    from specpilot.drafting.eagle_head import CONFIG_FILE, HEADS, resolve_head

    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path))
    name = "my-org/my-model"
    assert default_drafter(name) == "model"
    folder = HEADS.installed(name)
    assert folder.parent == tmp_path / "heads"
    folder.mkdir(parents=True)
    (folder / CONFIG_FILE).write_text("{}")
    assert default_drafter(name) == "eagle"
    assert resolve_head(None, name) == folder


@pytest.mark.parametrize(
    "text,message",
    [
        ("sd:drafter=magic", "unknown drafter 'magic'"),
        ("sd:policy=magic", "unknown policy 'magic'"),
        ("sd:drafter=eagle,head=x", "unknown option 'head' for drafter 'eagle'"),
        ("sd:drafter=eagle,policy=constant,depth=3", "unknown option 'depth'"),
        ("sd:drafter=dvi,adapter=x", "unknown option 'adapter'"),
        ("sd:drafter=eagle,tree_depth=deep", "tree_depth='deep' of drafter 'eagle'"),
        ("sd:policy=constant,k=0", "k must be in 1..64"),
        (
            "sd:drafter=model,policy=svip,k=3",
            "unknown option 'k' for drafter 'model' and policy 'svip'",
        ),
        ("sd:drafter=ngram,learn=maybe", "unknown option 'learn'"),
        ("sd:drafter=dvi,learn=maybe", "must be a boolean"),
        ("sd:policy=sv", "SV needs an acceptance profile"),
        ("default:k=3", "takes no options"),
        ("sd:k", "key=value"),
    ],
)
def test_bad_names_and_options_are_refused_when_made(text, message):
    with pytest.raises(ConfigError, match=message):
        MethodSpec.parse(text)


def test_without_a_policy_the_defaults_resolve_from_the_target():
    model = MethodSpec.of("model")
    assert model.resolved(torch.float32).policy == "goodput"
    assert MethodSpec.of("model", k=3).resolved(torch.float32).policy == "constant"
    assert model.resolved(None, fixed_length=True).policy == "constant"
    eagle = MethodSpec.of("eagle")
    assert eagle.resolved(torch.float32).policy == "tree-goodput"
    for batch in (1, 8):  # the controller, which may draft nothing, at every batch size
        on_ggml = eagle.resolved(torch.float32, batch=batch, backend="ggml")
        assert on_ggml.policy == "goodput" and on_ggml.runs_on_ggml
    assert eagle.resolved(torch.bfloat16).option("eagle_lookup") == EAGLE_BF16_LOOKUP
    assert eagle.resolved(torch.bfloat16, batch=4).option("eagle_lookup") is None
    named = MethodSpec.of("eagle", "constant")
    assert named.resolved(torch.bfloat16) is named
    # prompt lookup: constant k on torch; the goodput controller on ggml's steep curve (one row)
    lookup = MethodSpec.of("ngram")
    assert lookup.resolved(torch.bfloat16).policy == "constant"
    assert lookup.resolved(torch.float32, backend="ggml").policy == "goodput"
    assert lookup.resolved(torch.float32, batch=4, backend="ggml").policy == "constant"
    assert MethodSpec.of("ngram", k=3).resolved(torch.float32, backend="ggml").policy == "constant"
    capped = MethodSpec.of("ngram", max_k=4).resolved(torch.float32, backend="ggml")
    assert capped.policy == "goodput" and capped.option("max_k") == 4


def test_every_entry_declares_typed_options():
    assert set(DRAFTERS) == {"model", "ngram", "dvi", "eagle", "none"}
    assert set(POLICIES) == {
        "constant", "heuristic", "svip", "ltd", "tree-goodput", "sv", "goodput",
    }  # fmt: skip
    for entry in (*DRAFTERS.values(), *POLICIES.values()):
        for option in entry.options:
            assert option.kind in (int, float, bool, str), (entry.name, option.name)


def test_load_models_loads_the_default_draft_only_for_targets_without_a_head(monkeypatch):
    import specpilot.api as api

    loaded = []
    monkeypatch.setattr(api, "load_model", lambda name, **_: loaded.append(name) or name)
    monkeypatch.setattr(api, "check_same_tokenizer", lambda *models: None)
    assert api.load_models().draft is None  # the default target drafts with its eagle head
    assert api.load_models("some/model.gguf").draft == api.DEFAULT_DRAFT
    assert loaded == [DEFAULT_TARGET, "some/model.gguf", api.DEFAULT_DRAFT]
