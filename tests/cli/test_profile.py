"""`specpilot profile` on tiny models, and the theoretical speedup bound."""

from __future__ import annotations

import json

import pytest
from tiny import save_tiny

from specpilot.bench.profile import speedup_bound
from specpilot.cli import main
from specpilot.methods.goodput import profile_cache_path


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """`specpilot profile` keeps a copy in the cache: a temporary one here."""
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "cache"))


def test_speedup_bound_values():
    # (1 - 0.8^5) / (0.2 * (4 * 0.25 + 1)) = 0.67232 / 0.4
    assert speedup_bound(0.8, 4, 0.25) == pytest.approx(1.6808)
    assert speedup_bound(1.0, 3, 0.0) == pytest.approx(4.0)
    assert speedup_bound(0.0, 3, 0.5) == pytest.approx(1 / 2.5)


def test_profile_writes_json(tmp_path, capsys):
    target = save_tiny(tmp_path / "target", seed=0)
    draft = save_tiny(tmp_path / "draft", seed=0)
    out = tmp_path / "profile.json"
    code = main(
        [
            "profile",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--dtype",
            "float32",
            "--out",
            str(out),
            "--contexts",
            "8,16",
            "--max-verify",
            "4",
            "--gammas",
            "1,3",
            "--repeats",
            "1",
            "--max-new-tokens",
            "6",
            "--quiet",
        ]
    )
    assert code == 0
    profile = json.loads(out.read_text())
    assert set(profile["verify_ms"]) == {"8", "16"}
    assert all(len(curve) == 4 for curve in profile["verify_ms"].values())
    assert profile["cost_ratio"] > 0
    assert [row["gamma"] for row in profile["gammas"]] == [1, 3]
    assert profile["gammas"][0]["acceptance_rate"] == pytest.approx(1.0)  # draft == target
    assert "c = " in capsys.readouterr().out
    cached = profile_cache_path(str(target), "float32")  # the goodput controller's prior
    assert cached.is_relative_to(tmp_path / "cache") and json.loads(cached.read_text()) == profile


def test_profile_rejects_bad_lists(tmp_path, capsys):
    code = main(["profile", "--out", str(tmp_path / "x.json"), "--contexts", "a,b"])
    assert code == 2
    assert "comma-separated integers" in capsys.readouterr().err


def test_profile_times_the_eagle_drafter(tmp_path, capsys):
    from eagle_fixtures import tiny_head

    from specpilot.models import load_model

    target = save_tiny(tmp_path / "target", seed=0)
    runner = load_model(str(target), dtype="float32", progress=False).runner
    tiny_head(runner).save(tmp_path / "head")
    out = tmp_path / "profile.json"
    argv = ["profile", "--target", str(target), "--no-draft", "--dtype", "float32"]
    argv += ["--out", str(out), "--contexts", "8", "--max-verify", "2", "--repeats", "1"]
    argv += ["--max-new-tokens", "4", "--quiet", "--eagle-head", str(tmp_path / "head")]
    assert main(argv) == 0
    profile = json.loads(out.read_text())
    assert set(profile["eagle_step_ms"]) == {"1", "8"} and profile["eagle_cost_ratio"] > 0
    assert "eagle draft step" in capsys.readouterr().out
