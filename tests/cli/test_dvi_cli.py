"""`specpilot train-dvi | plot-dvi | generate --drafter dvi` on a tiny saved model (no download):
clear one-line errors for misuse, and a train → generate → plot round trip whose DVI output
equals plain decoding."""

from __future__ import annotations

import json
import random

import pytest
from tiny import save_tiny

from specpilot.cli import main
from specpilot.drafting.dvi_head import LATEST_FILE, META_FILE
from specpilot.drafting.dvi_learning.config import CONFIG_FILE
from specpilot.errors import ConfigError
from specpilot.methods import make_drafter
from specpilot.models.pair import ModelPair

DTYPE = ["--dtype", "float32", "--max-length", "128"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("dvi-cli") / "target", seed=0)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    rng = random.Random(1)
    path = tmp_path_factory.mktemp("dvi-prompts") / "prompts.jsonl"
    rows = [
        {"question_id": i, "turns": [" ".join(f"w{rng.randrange(4, 96)}" for _ in range(5))]}
        for i in range(8)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def trained(target, prompts, tmp_path_factory):
    """A train-dvi output folder: 4 steps of the full objective (the CLI keeps the 40-update KL
    warm-up, so these are distillation updates, which start once the buffer holds 8 tuples)."""
    out = tmp_path_factory.mktemp("dvi-train") / "run"
    argv = ["train-dvi", "--target", str(target), "--prompts", str(prompts), "--out", str(out)]
    argv += ["--steps", "4", "--train-batch", "8", "--rollout-blocks", "2"]
    argv += ["--max-new-tokens", "16", "--save-every", "2", "--split", "2", "--quiet", *DTYPE]
    assert main(argv) == 0
    return out


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(err: str, message: str) -> None:
    errors = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert message in errors[0], err
    assert err.strip().splitlines()[-1] == errors[0]
    assert "Traceback" not in err


# -- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra,option",
    [
        (["--drafter", "model", "--dvi-adapter", "somewhere"], "dvi_adapter"),
        (["--drafter", "none", "--dvi-split", "1"], "dvi_split"),
        (["--drafter", "ngram", "--learn"], "learn"),
        (["--learn"], "learn"),  # the default drafter is "model"
    ],
    ids=["adapter-with-model", "split-with-none", "learn-with-ngram", "learn-default-drafter"],
)
def test_dvi_options_belong_to_drafter_dvi(capsys, target, extra, option):
    code, _, err = run_cli(capsys, "generate", "--target", target, "--prompt", "w5", *extra)
    assert code == 2
    assert_one_line_error(err, f"unknown option {option!r} for drafter")
    assert "loading" not in err  # refused before any model is loaded


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--objective", "bogus"], "objective must be one of full, kl, pg, ce, got 'bogus'"),
        (["--steps", "0"], "steps must be >= 1, got 0"),
        (["--train-batch", "0"], "batch_size must be >= 1"),
        (["--save-every", "0"], "save_every must be >= 1"),
        (["--lr", "0"], "lr must be > 0"),
    ],
)
def test_train_dvi_bad_values(capsys, target, prompts, tmp_path, extra, message):
    code, _, err = run_cli(
        capsys,
        "train-dvi",
        "--target",
        target,
        "--prompts",
        prompts,
        "--out",
        tmp_path / "out",
        *extra,
    )
    assert code == 2
    assert_one_line_error(err, message)
    assert not (tmp_path / "out").exists()


def test_train_dvi_prompts_without_text(capsys, target, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"conversations": [{"from": "gpt", "value": "hi"}]}) + "\n")
    code, _, err = run_cli(
        capsys, "train-dvi", "--target", target, "--prompts", empty, "--out", tmp_path / "o"
    )
    assert code == 2
    assert_one_line_error(err, "no prompts to train on")


def generate_dvi(capsys, target, *extra):
    return run_cli(
        capsys, "generate", "--target", target, "--drafter", "dvi", "--prompt", "w5 w6", *extra
    )


def test_dvi_save_needs_learn(capsys, target, tmp_path):
    code, _, err = generate_dvi(capsys, target, "--dvi-save", tmp_path / "head", *DTYPE)
    assert code == 2
    assert_one_line_error(err, "--dvi-save saves the head that --learn trains: add --learn")
    assert "loading" not in err


def test_dvi_adapter_that_is_not_an_adapter(capsys, target, tmp_path):
    (tmp_path / "folder").mkdir()
    code, _, err = generate_dvi(capsys, target, "--dvi-adapter", tmp_path / "folder", *DTYPE)
    assert code == 2
    assert_one_line_error(err, "is not a DVI adapter (no specpilot_dvi.json)")
    code, _, err = generate_dvi(capsys, target, "--dvi-adapter", target, *DTYPE)
    assert code == 2
    assert_one_line_error(err, "is not a DVI adapter")


def test_dvi_split_out_of_range(capsys, target):
    code, _, err = generate_dvi(capsys, target, "--dvi-split", "4", *DTYPE)
    assert code == 2
    assert_one_line_error(err, "DVI split layer must be in 1..3, got 4")


def test_dvi_adapter_for_another_split(capsys, target, trained):
    code, _, err = generate_dvi(
        capsys, target, "--dvi-adapter", trained, "--dvi-split", "1", *DTYPE
    )
    assert code == 2
    assert_one_line_error(err, "--dvi-split")
    assert "split=2" in err


def test_dvi_adapter_with_corrupt_metadata(capsys, target, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / META_FILE).write_text("{oops")
    code, _, err = generate_dvi(capsys, target, "--dvi-adapter", adapter, *DTYPE)
    assert code == 2
    assert_one_line_error(err, "corrupt")


def test_registry_errors():
    with pytest.raises(ConfigError, match="lean decoder backend"):
        make_drafter("dvi", ModelPair(None, None))
    with pytest.raises(ConfigError, match="unknown option"):
        make_drafter("dvi", ModelPair(None, None), temperature=1)


# -- happy path --------------------------------------------------------------------------------
def test_train_dvi_writes_checkpoints_log_and_curve(trained):
    names = {p.name for p in trained.iterdir()}
    assert {LATEST_FILE, "train_log.csv", "learning_curve.png"} <= names
    latest = (trained / LATEST_FILE).read_text().strip()
    assert latest == "step-000004"
    assert (trained / latest / "adapter" / META_FILE).is_file()
    assert (trained / latest / "trainer_state.pt").is_file()
    meta = json.loads((trained / latest / "adapter" / META_FILE).read_text())
    assert meta["split"] == 2 and meta["num_layers"] == 4
    rows = (trained / "train_log.csv").read_text().splitlines()
    assert rows[0].startswith("step,updates,prompt,acceptance")
    assert [row.split(",")[0] for row in rows[1:]] == ["0", "1", "2", "3"]
    assert int(rows[-1].split(",")[1]) >= 1, "no update ran: the adapter is untrained"
    assert not any(p.name.endswith(".tmp") for p in trained.iterdir())


def answer(capsys, target, drafter, *extra):
    code, out, err = run_cli(
        capsys,
        "generate",
        "--target",
        target,
        "--drafter",
        drafter,
        "--prompt",
        "w5 w6 w7 w8",
        "--max-new-tokens",
        "24",
        "--json",
        *DTYPE,
        *extra,
    )
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


def test_generate_with_trained_adapter_equals_plain(capsys, target, trained):
    plain, _ = answer(capsys, target, "none")
    assert len(plain["token_ids"]) > 0
    dvi, _ = answer(capsys, target, "dvi", "--dvi-adapter", trained)
    assert dvi["text"] == plain["text"] and dvi["token_ids"] == plain["token_ids"]
    adapter = trained / (trained / LATEST_FILE).read_text().strip() / "adapter"
    direct, _ = answer(capsys, target, "dvi", "--dvi-adapter", adapter, "--draft-vocab", "40")
    assert direct["token_ids"] == plain["token_ids"]
    untrained, _ = answer(capsys, target, "dvi", "--dvi-split", "1")
    assert untrained["token_ids"] == plain["token_ids"]


def test_generate_learn_and_save(capsys, target, prompts, tmp_path):
    plain, _ = answer(capsys, target, "none")
    saved = tmp_path / "learned"
    learned, err = answer(capsys, target, "dvi", "--learn", "--dvi-save", saved)
    assert learned["token_ids"] == plain["token_ids"]
    assert "[dvi --learn:" in err and "adapter saved" in err
    assert (saved / META_FILE).is_file()
    again, _ = answer(capsys, target, "dvi", "--dvi-adapter", saved)
    assert again["token_ids"] == plain["token_ids"]


def test_learning_goes_on_with_the_runs_settings(target, trained, tmp_path):
    """--learn on a train-dvi folder uses the config the head was trained with
    (train_config.json); on a bare adapter folder, the defaults."""
    from specpilot import load_models
    from specpilot.drafting.dvi_learning import DviTrainConfig

    saved = json.loads((trained / CONFIG_FILE).read_text())
    assert saved["batch_size"] == 8 and saved["rollout_blocks"] == 2
    model = load_models(str(target), None, "float32", "cpu", 128)
    drafter = make_drafter("dvi", model, dvi_adapter=str(trained), learn="1")
    assert drafter.learner.config == DviTrainConfig(**saved)
    adapter = trained / (trained / LATEST_FILE).read_text().strip() / "adapter"
    drafter = make_drafter("dvi", model, dvi_adapter=str(adapter), learn="1")
    assert drafter.learner.config == DviTrainConfig()
    (tmp_path / CONFIG_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="corrupt"):
        DviTrainConfig.of_run(tmp_path)


def test_plot_dvi(capsys, trained, tmp_path):
    png = tmp_path / "curve.png"
    log = trained / "train_log.csv"
    code, _, err = run_cli(
        capsys, "plot-dvi", log, log, "--label", "a", "--label", "b", "--out", png
    )
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, err = run_cli(capsys, "plot-dvi", log, log, "--label", "a", "--out", png)
    assert code == 2
    assert_one_line_error(err, "give one --label per log (2), got 1")
    code, _, err = run_cli(capsys, "plot-dvi", tmp_path / "nope.csv", "--out", png)
    assert code == 2
    assert_one_line_error(err, "train-dvi log not found")
