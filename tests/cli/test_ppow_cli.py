"""`specpilot train-ppow` on a tiny saved model: fine-tune a train-eagle head (reusing its
answers), decode with the result (equal to plain decoding), resume, the distillation baseline,
and one-line errors."""

from __future__ import annotations

import json

from test_dvi_cli import assert_one_line_error, run_cli
from test_eagle_cli import DTYPE, data_dir, target, trained  # noqa: F401 (fixtures)

SMALL = ["--updates", "2", "--windows-per-update", "2", "--window", "4", "--group", "4"]
SMALL += ["--valid-samples", "2", "--eval-every", "2", "--adaw-sequences", "3", "--quiet"]


def test_train_ppow_then_generate_equals_plain(trained, target, tmp_path, capsys):  # noqa: F811
    eagle_out, _ = trained
    out = tmp_path / "ppow"
    argv = ["train-ppow", "--target", target, "--init", eagle_out, "--responses", eagle_out]
    argv += ["--out", out, *SMALL, *DTYPE]
    code, text, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert text.strip() == str(out / "head")
    rows = (out / "train_log.csv").read_text().splitlines()
    assert len(rows) == 4 and (out / "ppow_curves.png").is_file()
    prompt = ["--prompt", "w5 w6 w7 w8", "--max-new-tokens", "20", "--json", *DTYPE]
    code, plain, _ = run_cli(capsys, "generate", "--target", target, "--drafter", "none", *prompt)
    assert code == 0
    code, text, err = run_cli(
        capsys, "generate", "--target", target, "--drafter", "eagle", "--eagle-head", out, *prompt
    )
    assert code == 0, err
    assert json.loads(text)["token_ids"] == json.loads(plain)["token_ids"]
    # Re-running the finished command resumes at the end: the log is unchanged, also where the
    # bf16 autocast differs (it follows the machine a run resumes on).
    assert json.loads((out / "train_config.json").read_text())["bf16"] is None
    assert run_cli(capsys, *argv, "--no-bf16")[0] == 0
    assert run_cli(capsys, *argv, "--bf16")[0] == 0
    assert json.loads((out / "train_config.json").read_text())["bf16"] is True
    assert (out / "train_log.csv").read_text().splitlines() == rows


def test_distillation_baseline(trained, target, tmp_path, capsys):  # noqa: F811
    eagle_out, _ = trained
    out = tmp_path / "distill"
    code, _, err = run_cli(
        capsys, "train-ppow", "--target", target, "--init", eagle_out, "--responses", eagle_out,
        "--out", out, "--baseline", "distill", "--distill-batch-tokens", "16", *SMALL, *DTYPE,
        "--feature-cache", tmp_path / "features",
    )  # fmt: skip
    assert code == 0, err
    rows = [r for r in (out / "train_log.csv").read_text().splitlines()[1:] if r.split(",")[3]]
    assert len(rows) == 2 and (out / "head" / "eagle_config.json").is_file()
    assert list((tmp_path / "features").glob("*/*.safetensors"))


def test_bad_options_give_one_line_errors(trained, target, tmp_path, capsys):  # noqa: F811
    eagle_out, _ = trained
    base = ["train-ppow", "--target", target, "--init", eagle_out, "--out", tmp_path / "x"]
    code, _, err = run_cli(capsys, *base, "--responses", eagle_out, "--group", "1", *DTYPE)
    assert code == 2
    assert_one_line_error(err, "group must be >= 2")
    code, _, err = run_cli(capsys, *base, "--responses", tmp_path, *DTYPE)
    assert code == 2
    assert_one_line_error(err, "no answers")
    code, _, err = run_cli(capsys, *base, "--reference", "5", *DTYPE)
    assert code == 2
    assert_one_line_error(err, "--prox-reference greedy")
    code, _, err = run_cli(capsys, *base, "--gen-temperature", "1", *DTYPE)
    assert code == 2
    assert_one_line_error(err, "--prox-reference greedy or --no-proximity")
    code, _, err = run_cli(capsys, *base[:4], "ppow", *base[5:], *DTYPE)
    assert code == 2
    assert_one_line_error(err, "neither a folder nor a head committed")
