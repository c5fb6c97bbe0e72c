"""`specpilot train-eagle` and `generate --drafter eagle` on a tiny saved model (no download): a
data → train → generate round trip whose output equals plain decoding, resume, and one-line
errors for missing, corrupt and mismatched heads."""

from __future__ import annotations

import csv
import json
import random

import pytest
from test_dvi_cli import assert_one_line_error, run_cli
from tiny import save_tiny

from specpilot.api import build_engine, load_models
from specpilot.cli import main
from specpilot.policies import ConstantPolicy
from specpilot.policies.controller import GoodputPolicy
from specpilot.policies.tree_goodput import TreeGoodputPolicy

DTYPE = ["--dtype", "float32", "--max-length", "128"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("eagle-cli") / "target", seed=0)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    rng = random.Random(1)
    folder = tmp_path_factory.mktemp("eagle-data")

    def words(n):
        return " ".join(f"w{rng.randrange(4, 96)}" for _ in range(n))

    rows = [{"question": words(5), "answer": words(12)} for _ in range(10)]
    (folder / "gsm8k_train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows = [{"id": i, "instruction": words(4), "output": words(10)} for i in range(10)]
    (folder / "alpaca_sample.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    convs = [
        {"id": str(i), "conversations": [{"from": "human", "value": words(6)},
                                         {"from": "gpt", "value": words(9)}]}
        for i in range(10)
    ]  # fmt: skip
    (folder / "sharegpt_sample.jsonl").write_text("".join(json.dumps(r) + "\n" for r in convs))
    return folder


@pytest.fixture(scope="module")
def trained(target, data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("eagle-train") / "run"
    argv = ["train-eagle", "--target", str(target), "--out", str(out), "--data-dir", str(data_dir)]
    argv += ["--regenerate", "6", "--reference", "12", "--gen-max-new-tokens", "12"]
    argv += ["--gen-batch-size", "4", "--batch-tokens", "32", "--valid-samples", "3", "--quiet"]
    argv += ["--feature-cache", str(out.parent / "features")]
    assert main([*argv, *DTYPE]) == 0
    return out, argv


def test_train_then_generate_equals_plain(trained, target, capsys):
    out, argv = trained
    assert len((out / "data" / "responses.jsonl").read_text().splitlines()) == 6
    assert (out / "head" / "eagle_config.json").is_file() and (out / "train_log.csv").is_file()
    assert list((out.parent / "features").glob("*/*.safetensors"))  # --feature-cache kept them
    prompt = ["--prompt", "w5 w6 w7 w8", "--max-new-tokens", "20", "--json", *DTYPE]
    code, plain, _ = run_cli(capsys, "generate", "--target", target, "--drafter", "none", *prompt)
    assert code == 0
    # float32 on the CPU at batch 1: the default policy is tree-goodput (defaults.default_policy).
    for extra in ([], ["--policy", "constant"], ["--tree-topk", "1"], ["--eagle-lookup", "4"]):
        code, text, err = run_cli(
            capsys, "generate", "--target", target, "--drafter", "eagle", "--eagle-head", out,
            *extra, *prompt,
        )  # fmt: skip
        assert code == 0, err
        assert json.loads(text)["token_ids"] == json.loads(plain)["token_ids"]
    # Re-running the same command resumes: no prompt is answered twice.
    assert main([*argv, *DTYPE]) == 0
    assert len((out / "data" / "responses.jsonl").read_text().splitlines()) == 6


def test_the_api_sizes_float32_trees_by_goodput_at_batch_1(trained, target):
    """build_engine's default policy for eagle follows the loaded target (methods.defaults.
    default_policy): tree-goodput for one sequence in float32 on the CPU, the goodput controller
    for batches, the constant tree with a `k`."""
    out, _ = trained
    for batch, policy in ((1, TreeGoodputPolicy), (2, GoodputPolicy)):
        pair = load_models(str(target), None, "float32", "cpu", 128, batch)
        engine = build_engine(pair, "eagle", eagle_head=str(out))
        assert isinstance(engine.draft_policy, policy)
    assert engine.planner is not None
    assert engine.method.startswith("sd:drafter=eagle,policy=goodput,eagle_head=")
    engine = build_engine(pair, "eagle", eagle_head=str(out), k=3)
    assert isinstance(engine.draft_policy, ConstantPolicy) and engine.draft_policy.k == 3


def test_the_api_adds_a_lookup_branch_to_bf16_trees_of_one_sequence(trained, target):
    """build_engine's default drafter options (methods.defaults.default_drafter_options): a bf16
    target decoding one sequence gets the eagle tree's lookup branch; batches, float32, a named
    policy and a named lookup do not."""
    out, _ = trained
    head = {"eagle_head": str(out)}
    for dtype, batch, lookup in (("bfloat16", 1, 7), ("bfloat16", 2, 0), ("float32", 1, 0)):
        pair = load_models(str(target), None, dtype, "cpu", 128, batch)
        assert build_engine(pair, "eagle", **head).drafter.lookup == lookup
    pair = load_models(str(target), None, "bfloat16", "cpu", 128)
    assert build_engine(pair, "eagle", "constant", **head).drafter.lookup == 0
    assert build_engine(pair, "eagle", **head, eagle_lookup=2).drafter.lookup == 2


def test_bad_heads_give_one_line_errors(trained, target, tmp_path, capsys):
    out, _ = trained
    base = ["generate", "--target", target, "--drafter", "eagle", "--prompt", "w5", *DTYPE]
    code, _, err = run_cli(capsys, *base, "--eagle-head", tmp_path / "missing")
    assert code == 2
    assert_one_line_error(err, "not found")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "eagle_config.json").write_text("{not json")
    (broken / "model.safetensors").write_bytes(b"")
    code, _, err = run_cli(capsys, *base, "--eagle-head", broken)
    assert code == 2
    assert_one_line_error(err, "corrupt")
    other = save_tiny(tmp_path / "other", kind="llama", seed=1)
    code, _, err = run_cli(capsys, *base[:2], other, *base[3:], "--eagle-head", out)
    assert code == 2
    assert_one_line_error(err, "another target")
    code, _, err = run_cli(capsys, *base[:3], "--drafter", "model", *base[5:], "--eagle-head", out)
    assert code == 2
    assert_one_line_error(err, "unknown option 'eagle_head' for drafter 'model'")
    code, _, err = run_cli(capsys, *base, "--eagle-head", out, "--eagle-lookup", "-1")
    assert code == 2
    assert_one_line_error(err, "lookup must be >= 0")
    code, _, err = run_cli(
        capsys, *base[:3], "--drafter", "ngram", *base[5:], "--policy", "tree-goodput"
    )
    assert code == 2
    assert_one_line_error(err, "sizes dynamic trees")


def test_init_continues_a_trained_head_on_more_data(trained, target, data_dir, tmp_path, capsys):
    """--init: a new run starts from a trained head (its draft vocabulary kept) and reuses the
    answers copied into its data folder; shape options are refused beside it."""
    from safetensors.torch import load_file

    out, argv = trained
    more = tmp_path / "more"
    (more / "data").mkdir(parents=True)
    (more / "data" / "responses.jsonl").write_text((out / "data" / "responses.jsonl").read_text())
    grown = [*argv[:4], str(more), *argv[5:]]
    grown[grown.index("--regenerate") + 1] = "8"
    assert main([*grown, "--init", str(out), *DTYPE]) == 0
    assert len((more / "data" / "responses.jsonl").read_text().splitlines()) == 8
    before = load_file(out / "head" / "model.safetensors")
    after = load_file(more / "head" / "model.safetensors")
    assert before["draft_ids"].equal(after["draft_ids"])
    assert not before["fc"].equal(after["fc"])  # trained further
    code, _, err = run_cli(capsys, *grown, "--init", out, "--draft-vocab", "64", *DTYPE)
    assert code == 2
    assert_one_line_error(err, "--init keeps the head's own shape")


def test_valid_responses_score_the_head_on_a_fixed_held_out_set(trained, tmp_path, capsys):
    """--valid-responses: the head is scored on those answers (all the data trains); a folder
    without answers is refused before any model loads."""
    out, argv = trained
    held = tmp_path / "held"
    held.mkdir()
    answers = (out / "data" / "responses.jsonl").read_text().splitlines()
    (held / "responses.jsonl").write_text("\n".join(answers[:2]) + "\n")
    run = [*argv[:4], str(tmp_path / "fixed"), *argv[5:], "--eval-every", "1", *DTYPE]
    assert main([*run, "--valid-responses", str(held)]) == 0
    with (tmp_path / "fixed" / "train_log.csv").open() as log:
        rows = list(csv.DictReader(log))
    assert all(row["val_acc1"] for row in rows)
    empty = [*argv[:4], str(tmp_path / "empty"), *argv[5:], *DTYPE]
    code, _, err = run_cli(capsys, *empty, "--valid-responses", tmp_path / "none")
    assert code == 2
    assert_one_line_error(err, "--valid-responses")
