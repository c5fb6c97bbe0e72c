"""LTD's replay logs and environments: the accepted length a log predicts for a (depth, V)
choice is what real greedy decoding with that static tree accepts at the same position; the
environments' observations, rewards and trajectories; the cost model; policy folders."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from eagle_fixtures import tiny_head, tiny_target
from ltd_fixtures import tiny_nets
from tiny import TinyTokenizer

from specpilot.config import GenerationConfig
from specpilot.drafting.eagle import EagleDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.errors import ConfigError
from specpilot.models.decoder import DecoderRunner
from specpilot.policies import ConstantPolicy
from specpilot.policies.ltd_net import COMMITTED_POLICIES, LtdNets, LtdShape, resolve_policies
from specpilot.training.ltd.cost import CostModel
from specpilot.training.ltd.envs import (
    Chooser,
    DepthEnv,
    SizeEnv,
    depth_obs,
    hindsight_throughput,
    plain_throughput,
    replay_throughput,
    reward,
)
from specpilot.training.ltd.replay import RecordOptions, ReplayLog, record_replay

SHAPE = LtdShape(topk=3, max_depth=5, size_step=2, size_actions=8)
PROMPTS = [("a", [1, 5, 9, 14, 20, 7]), ("b", [1, 33, 44]), ("c", [1, 60, 61, 62, 63])]
NEW = 20


@pytest.fixture(scope="module")
def model():
    return tiny_target()


@pytest.fixture(scope="module")
def replay_folder(model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("replay")
    runner = DecoderRunner(model)
    drafter = EagleDrafter(runner, tiny_head(runner), depth=SHAPE.max_depth, topk=SHAPE.topk)
    options = RecordOptions(new_tokens=NEW, shard_prompts=2)
    record_replay(runner, TinyTokenizer(), drafter, SHAPE, PROMPTS[:2], folder, options,
                  progress=False)  # fmt: skip
    # Resuming records only the missing prompt.
    record_replay(runner, TinyTokenizer(), drafter, SHAPE, PROMPTS, folder, options,
                  progress=False)  # fmt: skip
    assert len(list(folder.glob("shard-*.safetensors"))) == 2
    return folder


@pytest.fixture(scope="module")
def log(replay_folder):
    return ReplayLog.load(replay_folder, SHAPE)


def test_one_recording_serves_every_size_grid(replay_folder, log):
    finer = LtdShape(SHAPE.topk, SHAPE.max_depth, size_step=1, size_actions=40)
    other = ReplayLog.load(replay_folder, finer)
    assert other.shape == finer and np.array_equal(other.path_ranks, log.path_ranks)
    with pytest.raises(ConfigError, match="width 3 and depth 5, not 4 and 5"):
        ReplayLog.load(replay_folder, LtdShape(4, SHAPE.max_depth))


def test_corrupt_replay_metadata_is_named(replay_folder, tmp_path):
    copy = tmp_path / "replay"
    shutil.copytree(replay_folder, copy)
    (copy / "replay.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is not replay metadata"):
        ReplayLog.load(copy, SHAPE)


def test_log_layout(log):
    assert len(log) == len(PROMPTS) * NEW
    assert sorted(set(log.prompt.tolist())) == [0, 1, 2]
    assert log.scores.shape == (len(log), SHAPE.candidates(SHAPE.max_depth))
    assert np.all(np.diff(log.draft_ms, axis=1) >= 0)  # cumulative time per depth


@pytest.mark.parametrize("depth,size", [(1, 2), (3, 4), (4, 10), (5, 40)])
def test_replay_accepts_what_greedy_decoding_accepts(model, log, depth, size):
    runner = DecoderRunner(model)
    drafter = EagleDrafter(runner, tiny_head(runner), depth=depth, topk=SHAPE.topk, nodes=size)
    engine = SpeculativeEngine(runner, TinyTokenizer(), drafter, ConstantPolicy(depth),
                               eos_ids=set())  # fmt: skip
    checked = 0
    for number, (_, prompt) in enumerate(PROMPTS):
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=NEW))
        rows = {int(log.context_len[i]): i for i in np.flatnonzero(log.prompt == number)}
        for record in result.stats.records:
            before = record.context_len - record.num_emitted
            if record.num_emitted == record.num_accepted + 1 and before in rows:
                assert log.accepted(rows[before], depth, size) == record.num_accepted
                checked += 1
    assert checked >= 10


def cost_model() -> CostModel:
    return CostModel([1.0 + d for d in range(SHAPE.max_depth)], [10, 100], [1, 64],
                     [[5.0, 9.0], [6.0, 12.0]])  # fmt: skip


def test_cost_model_interpolates():
    cost = cost_model()
    assert cost.verify(1, 10) == 5.0 and cost.verify(64, 100) == 12.0
    assert cost.verify(128, 10) == pytest.approx(9.0 + 64 * 4 / 63)  # extrapolated
    flat = CostModel([1.0], [1], [1, 2, 3], [[5.0, 9.0, 8.0]])
    assert flat.verify(5, 1) == pytest.approx(8.0 + 2 * 1.5)  # the whole curve's slope
    assert cost.verify(1, 55) == pytest.approx(5.5)
    assert cost.cycle_ms(2, 63, 10) == 2.0 + 9.0


def test_rewards():
    assert reward("throughput", 3, 20.0) == 2.0
    assert reward("accepted", 3, 20.0) == 4.0
    assert reward("time", 3, 20.0) == -2.0


def test_size_env(log):
    env = SizeEnv(log, cost_model(), Chooser(log), "throughput", seed=1)
    obs, _ = env.reset(seed=1)
    assert obs.shape == env.observation_space.shape
    _, value, terminated, _, info = env.step(2)
    cycle = info["cycle"]
    assert terminated and cycle["size"] == min(6, SHAPE.candidates(env.depth))
    assert cycle["accepted"] == log.accepted(env.position, env.depth, cycle["size"])
    assert value == pytest.approx((cycle["accepted"] + 1) / (cycle["ms"] / 10))


def test_depth_env_follows_the_trajectory(log):
    env = DepthEnv(log, cost_model(), Chooser(log, fixed_size=8), "accepted", seed=0)
    env.reset(seed=0)
    obs, value, terminated, _, _ = env.step(1)
    assert not terminated and value == 0.0 and env.depth == 2
    np.testing.assert_array_equal(obs, depth_obs(log, env.position, 2))
    position = env.position
    _, value, terminated, _, info = env.step(0)
    accepted = log.accepted(position, 2, 8)
    assert terminated and value == accepted + 1 and info["cycle"]["accepted"] == accepted
    env.reset()
    if log.prompt[min(position + accepted + 1, len(log) - 1)] == log.prompt[position]:
        assert env.position == position + accepted + 1
    for _ in range(SHAPE.max_depth - 1):
        _, _, terminated, _, _ = env.step(1)
    assert not terminated and env.depth == SHAPE.max_depth
    _, _, terminated, _, _ = env.step(1)  # CONTINUE at the maximum depth stops
    assert terminated


def test_replay_throughput_with_policies(log):
    nets = tiny_nets(SHAPE)
    result = replay_throughput(log, cost_model(), Chooser(log, nets.depth, nets.size))
    assert result["tokens_per_s"] > 0 and 1 <= result["depth"] <= SHAPE.max_depth


def test_hindsight_throughput_bounds_every_chooser(log):
    """With one choice it is that static tree's replay; with several it is at least every
    static tree's and a policy's, and mixes them where the outcome favours each."""
    cost = cost_model()
    depths, sizes = range(1, SHAPE.max_depth + 1), (2, 4, 8, 16)
    statics = []
    for depth in depths:
        for size in sizes:
            static = replay_throughput(log, cost, Chooser(log, fixed_depth=depth, fixed_size=size))
            alone = hindsight_throughput(log, cost, [depth], [size])
            assert alone == pytest.approx(static)
            statics.append(static["tokens_per_s"])
    bound = hindsight_throughput(log, cost, depths, sizes)
    assert bound["tokens_per_s"] > max(statics)
    nets = tiny_nets(SHAPE)
    policies = replay_throughput(log, cost, Chooser(log, nets.depth, nets.size))
    grid = [SHAPE.size_of(a) for a in range(SHAPE.size_actions)]
    assert hindsight_throughput(log, cost, depths, grid)["tokens_per_s"] >= policies["tokens_per_s"]
    # "Draft nothing" as a further choice: never below plain decoding or the ceiling without it,
    # and, alone, exactly plain decoding.
    skip = hindsight_throughput(log, cost, depths, sizes, skip=True)["tokens_per_s"]
    plain = plain_throughput(log, cost)
    assert skip >= max(plain, bound["tokens_per_s"]) * (1 - 1e-9)
    assert hindsight_throughput(log, cost, [], [], skip=True)["tokens_per_s"] == pytest.approx(
        plain
    )


def test_policy_folder_round_trip_and_errors(tmp_path):
    nets = tiny_nets(SHAPE)
    nets.save(tmp_path / "run" / "policies")
    loaded = LtdNets.load(resolve_policies(tmp_path / "run", None))
    assert loaded.shape == SHAPE
    obs = torch.randn(SHAPE.size_features)
    torch.testing.assert_close(loaded.size(obs), nets.size(obs))
    with pytest.raises(ConfigError, match="not found"):
        resolve_policies(tmp_path / "missing", None)
    with pytest.raises(ConfigError, match="not an LTD policy folder"):
        LtdNets.load(tmp_path)
    with pytest.raises(ConfigError, match="no LTD policies committed"):
        resolve_policies(None, "no-such-target")
    (tmp_path / "run" / "policies" / "size.safetensors").write_bytes(b"garbage")
    with pytest.raises(ConfigError, match="bad LTD policy folder"):
        LtdNets.load(tmp_path / "run" / "policies")


@pytest.mark.parametrize(
    "target", sorted(p.name for p in COMMITTED_POLICIES.iterdir() if p.is_dir())
)
def test_committed_policies_load_for_their_target(target):
    nets = LtdNets.load(resolve_policies(None, target))
    assert nets.target == target and nets.depth is not None and nets.size is not None


def test_a_backend_gets_its_own_committed_policies_where_they_exist():
    """The 1.5B has policies trained on the ggml backend's costs (narrower trees); torch, and a
    target without ggml ones, get the torch policies; a given folder is used as it is."""
    target = "qwen2.5-coder-1.5b-instruct"
    torch_folder = resolve_policies(None, target)
    ggml_folder = resolve_policies(None, target, "ggml")
    assert (
        ggml_folder == torch_folder / "ggml"
        and resolve_policies(None, target, "torch") == torch_folder
    )
    assert LtdNets.load(ggml_folder).shape.topk < LtdNets.load(torch_folder).shape.topk
    assert resolve_policies(None, "smollm2-135m-instruct", "ggml").name == "smollm2-135m-instruct"
    assert resolve_policies(torch_folder, None, "ggml") == torch_folder


def test_trainer_resumes_an_interrupted_stage(log, tmp_path):
    """A stage without done.json continues from its checkpoint's step count; the export is a
    loadable folder; the learning rate warms up then decays to 0."""
    import json

    from specpilot.training.ltd.config import LtdTrainConfig
    from specpilot.training.ltd.trainer import learning_rate, train_ltd

    small = dict(depth_steps=0, co_iterations=0, n_steps=16, batch_size=8, n_epochs=1,
                 eval_every=16, valid_fraction=0.34, fixed_size=8)  # fmt: skip
    train_ltd(log, cost_model(), tmp_path, LtdTrainConfig(size_steps=32, **small), progress=False)
    (tmp_path / "stages" / "1-size" / "done.json").unlink()
    summary = train_ltd(log, cost_model(), tmp_path, LtdTrainConfig(size_steps=64, **small),
                        progress=False)  # fmt: skip
    steps = [row.split(",")[2] for row in (tmp_path / "train_log.csv").read_text().splitlines()]
    assert steps[1:] == ["16", "32", "48", "64"]  # resumed at 32, not restarted
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert LtdNets.load(tmp_path / "policies").depth is None
    schedule = learning_rate(LtdTrainConfig(lr=1e-3, warmup=0.1))
    assert schedule(1.0) < 1e-4 and schedule(0.9) == pytest.approx(1e-3) and schedule(0.0) == 0
