"""The CLI's shape and the hooks it works through: one module per command, train-dvi's defaults
taken from the training dataclasses, the engine's observers (what profile-sv records with), and
the drafter hooks build_engine and generate use instead of asking for a drafter's type."""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass

import pytest
import torch
from tiny import TinyTokenizer, perturbed, save_tiny, tiny_model

from specpilot import cli
from specpilot.api import build_engine, load_models
from specpilot.cli.common import (
    add_method_arguments,
    add_model_arguments,
    answering_model,
    method_spec,
)
from specpilot.config import GenerationConfig
from specpilot.drafting import ModelDrafter
from specpilot.drafting.dvi_learning import DviTrainConfig
from specpilot.drafting.layer_split import SharedShallowTarget
from specpilot.engine import SpeculativeEngine
from specpilot.errors import ConfigError
from specpilot.models.decoder import DecoderRunner
from specpilot.policies import ConstantPolicy
from specpilot.policies.controller import GoodputController
from specpilot.policies.verify_all import VerifyAll
from specpilot.training.dvi.trainer import TrainDviOptions


def test_every_command_is_one_module():
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(commands.choices) == [name.replace("_", "-") for name in cli.COMMANDS]
    for name in cli.COMMANDS:
        module = importlib.import_module(f"specpilot.cli.{name}")
        assert callable(module.register) and callable(module.run)
        assert commands.choices[name.replace("_", "-")].get_default("run") is module.run


def test_train_dvi_defaults_come_from_the_dataclasses(monkeypatch):
    args = cli.build_parser().parse_args(["train-dvi", "--out", "x"])
    config, options = DviTrainConfig(), TrainDviOptions("p", 1, "x")
    assert (args.objective, args.train_batch, args.rollout_blocks) == (
        config.objective,
        config.batch_size,
        config.rollout_blocks,
    )
    assert (args.updates_per_step, args.lr, args.seed) == (
        config.updates_per_step,
        config.lr,
        config.seed,
    )
    assert (args.split, args.lora_rank, args.limit, args.max_new_tokens) == (
        options.split,
        options.lora_rank,
        options.limit,
        options.max_new_tokens,
    )
    assert (args.max_prompt_tokens, args.explore_temperature, args.save_every) == (
        options.max_prompt_tokens,
        options.explore_temperature,
        options.save_every,
    )

    @dataclass(frozen=True)
    class Changed(DviTrainConfig):
        batch_size: int = 32
        lr: float = 1e-3

    monkeypatch.setattr(
        importlib.import_module("specpilot.cli.train_dvi"), "DviTrainConfig", Changed
    )
    args = cli.build_parser().parse_args(["train-dvi", "--out", "x"])
    assert (args.train_batch, args.lr) == (32, 1e-3)


def test_observers_see_every_verified_row_step():
    model = tiny_model()
    target = DecoderRunner(model, max_length=64, batch_size=2)
    drafter = ModelDrafter(DecoderRunner(perturbed(model, 0.3), max_length=64, batch_size=2))
    engine = SpeculativeEngine(target, TinyTokenizer(), drafter, ConstantPolicy(3), eos_ids=set())
    config = GenerationConfig(max_new_tokens=16)
    unobserved = engine.generate_batch([list(range(3, 10)), list(range(20, 25))], config)
    seen = []
    engine.observers.append(lambda *step: seen.append(step))
    results = engine.generate_batch([list(range(3, 10)), list(range(20, 25))], config)
    assert [r.token_ids for r in results] == [r.token_ids for r in unobserved]
    for slot, result in enumerate(results):
        steps = [step for step in seen if step[0] == slot]
        assert len(steps) == result.stats.steps
        for (_, proposal, logits, record), expected in zip(
            steps, result.stats.records, strict=True
        ):
            assert record is expected
            assert proposal.k == record.num_verified
            assert logits.shape == (proposal.k + 1, target.vocab_size)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = save_tiny(tmp_path_factory.mktemp("shape") / "target", seed=0)
    return load_models(str(folder), None, "float32", "cpu", 64)


def test_drafters_name_the_runner_the_target_verifies_through(models):
    runner = models.target.runner
    shared = build_engine(models, "dvi")
    assert isinstance(shared.target, SharedShallowTarget)
    assert shared.target is shared.drafter.verifier(runner)
    own_cache = build_engine(models, "dvi", share_cache="0")
    assert own_cache.target is runner
    assert build_engine(models, "ngram").target is runner
    with pytest.raises(ConfigError, match="built on another target"):
        shared.drafter.verifier(own_cache.drafter.shallow)


def test_a_learning_drafter_reports_its_progress(models):
    assert build_engine(models, "dvi").drafter.summary() is None
    engine = build_engine(models, "dvi", learn=True)
    engine.generate("w5 w6 w7", GenerationConfig(max_new_tokens=8))
    assert engine.drafter.summary().startswith("dvi --learn: ")


def test_build_engine_takes_a_ready_verify_policy(models):
    policy = VerifyAll()
    assert build_engine(models, "none", verify_policy=policy).verify_policy is policy
    with pytest.raises(ConfigError, match="brings its own verify policy"):
        build_engine(models, "none", "goodput", verify_policy=policy)


def test_without_a_policy_the_goodput_controller_decides(tmp_path, models):
    """The default policy is goodput for the draft model, tree-goodput for eagle trees decoding
    one sequence in float32 on the CPU, constant where a fixed draft length is asked for and for
    the other drafters (methods.defaults.default_policy); a CLI spec without --policy resolves
    the same way, and adds the eagle tree's lookup branch where default_drafter_options does."""
    draft = save_tiny(tmp_path / "draft", seed=1)
    pair = load_models(models.target.path, str(draft), "float32", "cpu", 64)
    assert isinstance(build_engine(pair).planner, GoodputController)
    fixed = [
        build_engine(pair, k=3),
        build_engine(pair, verify_policy=VerifyAll()),
        build_engine(models, "ngram"),
        build_engine(models, "none"),
        build_engine(models, "dvi", learn=True),
    ]
    for engine in fixed:
        assert engine.planner is None and isinstance(engine.draft_policy, ConstantPolicy)
    assert build_engine(pair, k=3).draft_policy.k == 3
    parser = argparse.ArgumentParser()
    add_model_arguments(parser, max_new_tokens=8)
    add_method_arguments(parser)
    eagle = ["--drafter", "eagle"]
    model = ["--drafter", "model"]
    # The eagle tree's default lookup branch (methods.defaults.default_drafter_options): bf16,
    # one sequence; the spec resolves its default from the target's dtype on the CPU (None: not
    # on the CPU) and batch.
    f32, bf16 = torch.float32, torch.bfloat16
    for argv, dtype, batch, policy, lookup in [
        ([], f32, 1, "tree-goodput", None),  # the default target has an eagle head
        (model, f32, 1, "goodput", None),
        ([*model, "--k", "2"], f32, 1, "constant", None),
        (["--drafter", "ngram"], f32, 1, "constant", None),
        (eagle, f32, 1, "tree-goodput", None),
        ([*eagle, "--k", "3"], f32, 1, "constant", None),
        (eagle, f32, 4, "goodput", None),
        (eagle, bf16, 1, "constant", 7),
        ([*eagle, "--eagle-lookup", "0"], bf16, 1, "constant", 0),
        ([*eagle, "--policy", "constant"], bf16, 1, "constant", None),
        ([*eagle, "--k", "3"], bf16, 1, "constant", None),
        (eagle, bf16, 4, "goodput", None),
        (eagle, None, 1, "constant", None),
    ]:
        spec = method_spec(parser.parse_args(argv)).resolved(dtype, batch)
        assert (spec.policy, spec.option("eagle_lookup")) == (policy, lookup), argv


def test_the_trainers_answer_on_the_bf16_torch_target_when_it_is_one():
    """--gen-backend auto: the bf16 torch target answers (measured fastest), as does an explicit
    torch; nothing else is loaded for them."""
    for backend, dtype in (("auto", "bfloat16"), ("torch", "float32"), ("torch", "bfloat16")):
        args = argparse.Namespace(gen_backend=backend, dtype=dtype, target="nowhere/none.gguf")
        assert answering_model(args) is None, (backend, dtype)
