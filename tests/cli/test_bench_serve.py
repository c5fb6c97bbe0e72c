"""`specpilot bench-serve` against a tiny server: every level completes, the report, table and
plot are written; a non-loopback or unreachable URL is a clear error."""

from __future__ import annotations

import json

import pytest
from serve_fixtures import ServerThread, tiny_engine, tiny_pair

from specpilot.api import build_engine, load_models
from specpilot.cli import main
from specpilot.config import GenerationConfig
from specpilot.serve import create_app


def test_bench_serve_reports_every_level(tmp_path, capsys):
    engine = tiny_engine(*tiny_pair(tmp_path), batch_size=4)
    report, plot = tmp_path / "load.json", tmp_path / "load.png"
    with ServerThread(create_app(engine, "tiny", GenerationConfig(8))) as server:
        argv = ["bench-serve", "--url", server.url, "--concurrency", "1,4", "--requests", "6"]
        argv += ["--max-tokens", "8", "--json-out", str(report), "--plot", str(plot)]
        assert main(argv) == 0
    document = json.loads(report.read_text())
    assert document["model"] == "tiny" and document["machine"]["cpu"]
    levels = document["levels"]
    assert [level["concurrency"] for level in levels] == [1, 4]
    for level in levels:
        assert (level["requests"], level["errors"], level["timed_out"]) == (6, 0, False)
        assert level["output_tokens"] > 0 and level["ttft_p50_ms"] > 0
        assert level["mean_accepted_tokens"] >= 1
    assert plot.stat().st_size > 0
    assert "TTFT p50" in capsys.readouterr().out


def test_bench_serve_compares_servers_in_turns(tmp_path, capsys):
    """Two servers, one level each in rounds: every request served by both, one paired ratio per
    level from one speed ratio per round."""
    pair = tiny_pair(tmp_path)
    report = tmp_path / "turns.json"
    sd = create_app(tiny_engine(*pair, batch_size=2), "sd", GenerationConfig(8))
    ar = create_app(
        build_engine(load_models(pair[0], None, "float32"), "none"), "ar", GenerationConfig(8)
    )
    with ServerThread(sd) as first, ServerThread(ar) as second:
        argv = ["bench-serve", "--url", first.url, "--url", second.url, "--concurrency", "1,2"]
        argv += ["--requests", "5", "--max-tokens", "8", "--json-out", str(report)]
        assert main(argv) == 0
        assert main([*argv, "--plot", str(tmp_path / "x.png")]) == 2
    document = json.loads(report.read_text())
    assert [s["model"] for s in document["servers"]] == ["sd", "ar"]
    for server in document["servers"]:
        assert [(lv["concurrency"], lv["requests"], lv["errors"]) for lv in server["levels"]] == [
            (1, 5, 0),
            (2, 5, 0),
        ]
    assert [(p["concurrency"], p["server"], len(p["ratios"])) for p in document["paired"]] == [
        (1, 1, 5),
        (2, 1, 3),
    ]
    assert all(p["median_ratio"] > 0 for p in document["paired"])
    out = capsys.readouterr()
    assert f"{second.url} / {first.url}" in out.out and "--plot draws one" in out.err


@pytest.mark.parametrize(
    "url,message",
    [
        ("http://example.com:8000", "on this machine"),
        ("https://127.0.0.1:8000", "on this machine"),
        ("http://127.0.0.1:9", "cannot reach"),
    ],
)
def test_bench_serve_refuses_bad_urls(url, message, capsys):
    assert main(["bench-serve", "--url", url, "--requests", "1", "--concurrency", "1"]) == 2
    assert message in capsys.readouterr().err


def test_bench_serve_checks_its_bounds(capsys):
    assert main(["bench-serve", "--concurrency", "0"]) == 2
    assert main(["bench-serve", "--requests", "0"]) == 2
    assert main(["bench-serve", "--concurrency", "a,b"]) == 2
    assert "--concurrency" in capsys.readouterr().err
