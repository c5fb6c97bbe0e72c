"""`specpilot profile-sv` writes a profile that `--policy sv` uses, on tiny saved models; and the
errors a user meets without one."""

from __future__ import annotations

import json

import pytest
from tiny import save_tiny

from specpilot.cli import main

MODEL_ARGS = ["--dtype", "float32", "--max-new-tokens", "10"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sv")
    return save_tiny(root / "target", seed=0), save_tiny(root / "draft", seed=1)


def test_profile_then_generate(capsys, folders, tmp_path):
    target, draft = folders
    profile = tmp_path / "sv.json"
    args = ["--target", str(target), "--draft", str(draft), *MODEL_ARGS]
    code = main(
        [
            "profile-sv",
            *args,
            "--companion",
            "early-exit:target:2",
            "--max-verify",
            "8",
            "--min-count",
            "5",
            "--out",
            str(profile),
            "--quiet",
        ]
    )
    assert code == 0
    saved = json.loads(profile.read_text())
    assert saved["companion"] == "early-exit:target:2"
    assert saved["records"] > 0 and len(saved["verify_ms"]["128"]) == 8
    samples = saved["samples"]  # one α per (S, A): recorded by the engine observer
    assert len(samples["alpha"]) == len(samples["s"]) == len(samples["a"]) == saved["records"]
    assert {"IG_SA", "IG_S", "IG_A", "H_X"} <= set(saved["information_gain"])
    assert "information gain" in capsys.readouterr().out
    code = main(
        ["generate", *args, "--policy", "sv", "--sv-profile", str(profile), "--prompt", "w5 w6"]
        + ["--json"]
    )
    assert code == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(answer["token_ids"]) > 0
    # the goodput controller plans the draft lengths, SV trims them (docs/methods.md §7.6)
    code = main(
        ["generate", *args, "--policy", "goodput", "--sv-profile", str(profile), "--json"]
        + ["--prompt", "w5 w6"]
    )
    assert code == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(answer["token_ids"]) > 0


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--policy", "sv"], "profile-sv --out"),
        (["--policy", "sv", "--sv-profile", "/nonexistent.json"], "does not exist"),
        (["--k", "3", "--companion", "early-exit:target:2"], "belongs to policy sv"),
        # the default policy (goodput) takes SV after it, and so the profile SV needs
        (["--companion", "early-exit:target:2"], "needs an acceptance profile"),
    ],
)
def test_sv_errors_are_clear(capsys, folders, extra, message):
    target, draft = folders
    code = main(
        ["generate", "--target", str(target), "--draft", str(draft), "--prompt", "w5", *extra]
    )
    assert code == 2
    assert message in capsys.readouterr().err


def test_generate_batch_answers_every_prompt(capsys, folders, tmp_path):
    target, draft = folders
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"question_id": i, "turns": [" ".join(f"w{5 + j}" for j in range(i + 1))]})
            + "\n"
            for i in range(3)
        )
    )
    args = ["--target", str(target), "--draft", str(draft), *MODEL_ARGS, "--json"]
    code = main(["generate", *args, "--prompts-file", str(prompts), "--batch-size", "2"])
    assert code == 0
    batched = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    code = main(["generate", *args, "--prompts-file", str(prompts)])
    single = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [b["question_id"] for b in batched] == [0, 1, 2]
    assert [b["turns"] for b in batched] == [s["turns"] for s in single]
