"""`specpilot train-ltd` end to end on a tiny saved model (a few PPO steps), then `generate
--policy ltd` with the written folder equals plain decoding; resume; one-line errors for bad
policy folders and missing committed policies."""

from __future__ import annotations

import json

import pytest
import torch
from eagle_fixtures import tiny_head
from test_dvi_cli import assert_one_line_error, run_cli
from test_eagle_cli import DTYPE, data_dir, target  # noqa: F401  (fixtures)

from specpilot.cli import main
from specpilot.models.decoder import DecoderRunner
from specpilot.models.loading import load_model
from specpilot.policies.ltd_net import LtdNets

TINY = ["--topk", "3", "--max-depth", "4", "--size-step", "2", "--size-actions", "6"]
PPO = ["--size-steps", "64", "--depth-steps", "64", "--co-steps", "32", "--co-iterations", "1"]
PPO += ["--n-steps", "32", "--batch-size", "16", "--n-epochs", "2", "--eval-every", "32"]


@pytest.fixture(scope="module")
def head(target, tmp_path_factory):  # noqa: F811
    model = load_model(str(target), dtype="float32", max_length=128)
    folder = tmp_path_factory.mktemp("ltd-head") / "head"
    tiny_head(model.runner).save(folder, dtype=torch.float32)
    assert isinstance(model.runner, DecoderRunner)
    return folder


@pytest.fixture(scope="module")
def trained(target, head, data_dir, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("ltd-train") / "run"
    argv = ["train-ltd", "--target", str(target), "--eagle-head", str(head), "--out", str(out)]
    argv += ["--data-dir", str(data_dir), "--prompts", "4", "--new-tokens", "10", "--quiet"]
    argv += [*TINY, *PPO, "--valid-fraction", "0.25", *DTYPE]
    assert main(argv) == 0
    return out, argv


def test_train_writes_a_loadable_folder(trained):
    out, argv = trained
    nets = LtdNets.load(out / "policies")
    assert nets.depth is not None and nets.size is not None and nets.shape.topk == 3
    rows = (out / "train_log.csv").read_text().splitlines()
    assert len(rows) > 4 and (out / "curves.png").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert [s["stage"] for s in summary["stages"]] == ["1-size", "2-depth", "3-size"]
    assert set(summary["ltd"]) == {"both", "depth", "size"}
    for use, replay in summary["ltd"].items():  # the ceiling of each use is above its policies
        assert summary["hindsight"][use]["tokens_per_s"] >= replay["tokens_per_s"] - 1e-9
    assert main(argv) == 0  # resuming: every stage is done, nothing is recorded twice
    assert len((out / "train_log.csv").read_text().splitlines()) == len(rows)


@pytest.mark.parametrize("use", ["both", "depth", "size"])
def test_generate_with_ltd_equals_plain(trained, target, head, capsys, use):  # noqa: F811
    out, _ = trained
    prompt = ["--prompt", "w5 w6 w7 w8", "--max-new-tokens", "20", "--json", *DTYPE]
    code, plain, _ = run_cli(capsys, "generate", "--target", target, "--drafter", "none", *prompt)
    assert code == 0
    code, text, err = run_cli(
        capsys, "generate", "--target", target, "--drafter", "eagle", "--eagle-head", head,
        "--policy", "ltd", "--ltd-policies", out, "--policy-option", f"use={use}", *prompt,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(text)["token_ids"] == json.loads(plain)["token_ids"]


def test_bad_policy_folders_give_one_line_errors(trained, target, head, tmp_path, capsys):  # noqa: F811
    out, _ = trained
    base = ["generate", "--target", target, "--drafter", "eagle", "--eagle-head", head,
            "--prompt", "w5", *DTYPE]  # fmt: skip
    cases = [
        (["--policy", "ltd", "--ltd-policies", tmp_path / "missing"], "not found"),
        (["--policy", "ltd", "--ltd-policies", tmp_path], "not an LTD policy folder"),
        (["--policy", "ltd"], "train-ltd --target"),
        (
            ["--policy", "constant", "--ltd-policies", out],
            "unknown option 'ltd_policies' for drafter 'eagle' and policy 'constant'",
        ),
        (["--policy", "ltd", "--ltd-policies", out, "--tree-topk", "4"], "top-k 3"),
        (["--policy", "ltd", "--ltd-policies", out, "--policy-option", "use=x"], "use must"),
    ]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "ltd_config.json").write_text("{not json")
    cases.append((["--policy", "ltd", "--ltd-policies", broken], "bad LTD policy folder"))
    for extra, message in cases:
        code, _, err = run_cli(capsys, *base, *extra)
        assert code == 2, (extra, err)
        assert_one_line_error(err, message)


def test_ltd_in_bench(trained, target, head, tmp_path, capsys):  # noqa: F811
    """`sd:drafter=eagle,policy=ltd,ltd_policies=DIR[,use=...]` runs in bench with no greedy
    mismatch, and reports the policies' own time."""
    out, _ = trained
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "a", "turns": ["w5 w6"]}) + "\n")
    both = f"sd:drafter=eagle,eagle_head={head},policy=ltd,ltd_policies={out}"
    size = f"{both},use=size,check_every=2"
    code, text, err = run_cli(
        capsys, "bench", "--target", target, "--prompts", prompts, "--max-new-tokens", "12",
        "--quiet", "--method", both, "--method", size, *DTYPE,
    )  # fmt: skip
    assert code == 0, err
    rows = {r["method"]: r for r in json.loads(text.strip().splitlines()[-1])["results"]}
    assert rows[both]["greedy_mismatches"] == rows[size]["greedy_mismatches"] == 0
