"""The llama-cpp bench peer: method strings, the skip line, the server protocol against a fake
llama-server, and (when built) the real binary on a real GGUF."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from specpilot.bench import llama_cpp_peer as peer
from specpilot.bench.llama_server import (
    LlamaServer,
    completion_request,
    find_binary,
    parse_completion,
)
from specpilot.bench.methods import parse_method
from specpilot.bench.run import bench_methods
from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.errors import ConfigError


def test_method_strings():
    assert peer.spec_type({}) is None
    assert peer.spec_type({"spec": "draft"}) == "draft-simple"
    assert peer.spec_type({"spec": "ngram-mod", "n_max": "4"}) == "ngram-mod"
    assert parse_method("llama-cpp:spec=draft").needs_draft
    assert not parse_method("llama-cpp:spec=ngram-simple").needs_draft
    for bad in ({"spec": "eagle"}, {"k": "2"}, {"n_max": "2"}, {"spec": "draft", "n_max": "x"}):
        with pytest.raises(ConfigError):
            peer.spec_type(bad)


def test_server_args():
    plain = peer.server_args(Path("t.gguf"), 2, {})
    assert plain[:2] == ["-m", "t.gguf"] and "--spec-type" not in plain
    assert plain[plain.index("-t") + 1] == "2" and plain[plain.index("-np") + 1] == "1"
    spec = peer.server_args(Path("t.gguf"), 2, {"spec": "draft", "n_max": "3"}, Path("d.gguf"))
    assert spec[spec.index("--spec-type") + 1] == "draft-simple"
    assert spec[spec.index("-md") + 1] == "d.gguf"
    assert spec[spec.index("--spec-draft-n-max") + 1] == "3"
    with pytest.raises(ConfigError):
        peer.server_args(Path("t.gguf"), 2, {"spec": "draft"})


def test_absent_binary_is_skipped_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECPILOT_LLAMA_CPP_BIN", str(tmp_path))
    specs = bench_methods(["llama-cpp", "llama-cpp:spec=ngram-simple", "sd"])
    assert [s.text for s in specs] == ["ar", "sd"]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2
    assert all("bash scripts/build_llama_cpp.sh" in line for line in lines)


def test_request_and_response():
    greedy = completion_request([5, 6], 16, SamplingConfig(), 3)
    assert greedy["prompt"] == [5, 6] and greedy["n_predict"] == 16
    assert greedy["temperature"] == 0 and not greedy["cache_prompt"] and "top_k" not in greedy
    assert (
        not greedy["ignore_eos"]
        and completion_request([5], 4, SamplingConfig(), 0, False)["ignore_eos"]
    )
    sampled = completion_request([5], 4, SamplingConfig(temperature=0.7, top_k=20), 3)
    assert sampled["top_k"] == 20 and sampled["seed"] == 3
    done = parse_completion(
        {"tokens": [1, 2], "timings": {"prompt_ms": 10.0, "predicted_ms": 30.0}}
    )
    assert done.token_ids == [1, 2] and done.seconds == pytest.approx(0.04)
    with pytest.raises(ConfigError):
        parse_completion({"content": "x"})


FAKE_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        tokens = [t + 1 for t in body["prompt"]][: body["n_predict"]]
        out = {"tokens": tokens, "timings": {"prompt_ms": 1.0, "predicted_ms": 2.0}}
        if "--spec-type" in sys.argv:  # what llama-server adds once it drafted
            out["timings"].update(draft_n=9, draft_n_accepted=4)
        self.send_response(200); self.end_headers(); self.wfile.write(json.dumps(out).encode())
    def log_message(self, *args):
        pass
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def _fake_binary(folder: Path) -> Path:
    script = folder / "fake_server.py"
    script.write_text(FAKE_SERVER)
    binary = folder / "llama-server"
    binary.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    return binary


def test_fake_server_round_trip(tmp_path):
    server = LlamaServer(_fake_binary(tmp_path), ["-m", "x.gguf"], startup_s=30)
    try:
        done = server.complete(completion_request([1, 2, 3], 2, SamplingConfig(), 0))
    finally:
        server.close()
    assert done.token_ids == [2, 3] and done.seconds == pytest.approx(0.003)
    assert server.process.poll() is not None


def test_turn_stats_from_the_server_totals():
    # 12 tokens, 9 drafted, 4 accepted: 8 target forwards (the prompt's, then 7 verify steps)
    stats = peer.turn_stats(12, 30, {"prompt_ms": 5.0, "predicted_ms": 15.0, "prompt_n": 30,
                                     "draft_n": 9, "draft_n_accepted": 4})  # fmt: skip
    assert (stats.drafted, stats.verified, stats.accepted) == (9, 9, 4)
    assert stats.acceptance_rate == pytest.approx(4 / 9)
    assert stats.steps == 8 and stats.new_tokens == 12
    assert stats.mean_accepted_tokens == pytest.approx(12 / 8)
    assert stats.records[0].num_drafted == 0  # the prompt forward drafts nothing
    assert all(r.num_accepted <= r.num_drafted for r in stats.records)
    assert [r.context_len for r in stats.records[:3]] == [30, 31, 33]
    assert stats.prefill_s == pytest.approx(0.005) and stats.total_s == pytest.approx(0.02)
    quiet = peer.turn_stats(5, 30, {"prompt_ms": 1.0, "predicted_ms": 2.0})  # nothing drafted
    assert quiet.steps == 5 and quiet.drafted == 0 and quiet.mean_accepted_tokens == 1.0
    cut = peer.turn_stats(2, 30, {"draft_n": 3, "draft_n_accepted": 3})  # EOS inside the drafts
    assert cut.new_tokens == 2 and cut.accepted == 3 and cut.steps == 1


class _Tokenizer:
    chat_template = None

    def __call__(self, text):
        return {"input_ids": [len(text)]}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _method(server: LlamaServer, speculative: bool) -> peer.LlamaCppMethod:
    method = object.__new__(peer.LlamaCppMethod)
    method.tokenizer, method.server, method.speculative = _Tokenizer(), server, speculative
    return method


def test_speculative_turns_report_acceptance(tmp_path):
    config = GenerationConfig(max_new_tokens=8)
    binary = _fake_binary(tmp_path)
    for args, speculative in (([], False), (["--spec-type", "draft-eagle3"], True)):
        server = LlamaServer(binary, ["-m", "x.gguf", *args], startup_s=30)
        try:
            [[turn]] = _method(server, speculative).run([("hello",)], config)
        finally:
            server.close()
        assert turn.token_ids == [6] and turn.seconds == pytest.approx(0.003)
        if not speculative:
            assert turn.stats is None  # plain decoding: the bench shows no acceptance
            continue
        assert (turn.stats.drafted, turn.stats.accepted) == (9, 4)
        assert turn.stats.acceptance_rate == pytest.approx(4 / 9)


def test_server_that_exits_reports_its_log(tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\necho 'error: model not found' >&2\nexit 1\n")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(ConfigError, match="model not found"):
        LlamaServer(binary, [], startup_s=30)


def _real_gguf() -> Path | None:
    from specpilot.files import cache_root

    for name in ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"):
        path = cache_root() / "gguf" / f"{name}.gguf"
        if path.is_file():
            return path
    return None


@pytest.mark.skipif(find_binary() is None, reason="llama-server not built")
@pytest.mark.skipif(_real_gguf() is None, reason="no offline GGUF in the cache")
def test_real_binary_greedy():
    server = LlamaServer(find_binary(), peer.server_args(_real_gguf(), 1, {}))
    try:
        request = completion_request([1, 2, 3, 4, 5], 12, SamplingConfig(), 0)
        first, second = server.complete(request), server.complete(request)
    finally:
        server.close()
    assert len(first.token_ids) == 12 and first.seconds > 0
    assert first.token_ids == second.token_ids  # greedy, no prompt cache: the same run twice
