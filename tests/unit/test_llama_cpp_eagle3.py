"""The `llama-cpp:spec=eagle3` peer: method strings, server flags, what llama.cpp refuses, the
cached conversion against a fake converter, and (when everything is there) the real converter
and llama-server drafting with the committed SmolLM2 head."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from specpilot.bench import llama_cpp_eagle3 as eagle3
from specpilot.bench import llama_cpp_peer as peer
from specpilot.bench.methods import parse_method
from specpilot.drafting.eagle_head import COMMITTED_HEADS, CONFIG_FILE
from specpilot.errors import ConfigError

QWEN, SMOL = "qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct"


def _shape(name: str) -> SimpleNamespace:
    return SimpleNamespace(**json.loads((COMMITTED_HEADS / name / CONFIG_FILE).read_text()))


def test_method_strings():
    assert peer.spec_type({"spec": "eagle3"}) == "draft-eagle3"
    assert peer.spec_type({"spec": "draft-eagle3", "eagle_head": "h", "n_max": "4"})
    assert not parse_method("llama-cpp:spec=eagle3").needs_draft  # the head, not --draft
    for bad in ({"spec": "draft", "eagle_head": "h"}, {"eagle_head": "h"}):
        with pytest.raises(ConfigError):
            peer.spec_type(bad)


def test_server_args():
    args = peer.server_args(Path("t.gguf"), 2, {"spec": "eagle3", "n_max": "4"}, Path("h.gguf"))
    assert args[args.index("--spec-type") + 1] == "draft-eagle3"
    assert args[args.index("-md") + 1] == "h.gguf" and args[args.index("-td") + 1] == "2"
    assert args[args.index("--spec-draft-n-max") + 1] == "4"
    with pytest.raises(ConfigError, match="draft GGUF"):
        peer.server_args(Path("t.gguf"), 2, {"spec": "eagle3"})


def test_refusals_of_the_committed_heads():
    qwen = eagle3.refusals(_shape(QWEN))  # a q/k/v bias, on a Qwen2 target
    assert len(qwen) == 2 and "bias" in qwen[0] and "qwen2" in qwen[1]
    assert eagle3.refusals(_shape(SMOL)) == []  # bias-free, on a Llama target


def test_qwen_head_is_refused_before_converting(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match=r"q/k/v bias.*qwen2 graph records no layer inputs"):
        eagle3.draft_gguf(None, QWEN, tmp_path)
    assert not (tmp_path / "eagle3-gguf").exists()


FAKE_CONVERTER = """
import json, os, sys
from pathlib import Path
head, target = Path(sys.argv[1]), sys.argv[sys.argv.index("--target-model-dir") + 1]
out = Path(sys.argv[sys.argv.index("--outfile") + 1])
assert json.loads((head / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
assert (head / "model.safetensors").is_file() and (Path(target) / "config.json").is_file()
assert os.environ["PYTHONPATH"].split(os.pathsep)[0].endswith("gguf-py")
if "FAIL" in os.environ:
    sys.exit("boom: " + os.environ["FAIL"])
with open(Path(__file__).parent / "calls", "a") as f:
    f.write("x")
out.write_bytes(b"GGUF")
"""


@pytest.fixture
def fake_converter(tmp_path, monkeypatch):
    source = tmp_path / "llama.cpp"
    source.mkdir()
    (source / "convert_hf_to_gguf.py").write_text(FAKE_CONVERTER)
    monkeypatch.setattr(eagle3, "vendored_source", lambda: source)
    monkeypatch.setattr(eagle3, "has_sentencepiece", lambda: True)
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "cache"))
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"vocab_size": 49152, "hidden_size": 576}))
    return source, target


def test_conversion_is_cached_by_head_and_target(fake_converter):
    source, target = fake_converter
    first = eagle3.draft_gguf(None, SMOL, target)
    assert first.read_bytes() == b"GGUF" and first.parent.name == "eagle3-gguf"
    assert eagle3.draft_gguf(None, SMOL, target) == first  # cached: no second conversion
    assert (source / "calls").read_text() == "x"
    assert not list(first.parent.glob(".convert.*"))  # the temporary export is gone


def test_converter_failure_is_one_error(fake_converter, monkeypatch):
    _, target = fake_converter
    monkeypatch.setenv("FAIL", "no tokenizer")
    with pytest.raises(ConfigError, match="boom: no tokenizer"):
        eagle3.draft_gguf(None, SMOL, target)


def test_missing_converter_or_sentencepiece(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path))
    monkeypatch.setattr(eagle3, "vendored_source", lambda: tmp_path / "none")
    with pytest.raises(ConfigError, match="build_llama_cpp.sh"):
        eagle3.convert(None, tmp_path, tmp_path / "x.gguf")
    (tmp_path / "src").mkdir()
    monkeypatch.setattr(eagle3, "vendored_source", lambda: tmp_path / "src")
    (tmp_path / "src" / "convert_hf_to_gguf.py").write_text("")
    monkeypatch.setattr(eagle3, "has_sentencepiece", lambda: False)
    with pytest.raises(ConfigError, match="pip install 'sentencepiece"):
        eagle3.convert(None, tmp_path, tmp_path / "x.gguf")


def _real_setup() -> tuple[Path, Path] | None:
    from specpilot.bench.llama_server import find_binary
    from specpilot.files import cache_root

    target_gguf = cache_root() / "gguf" / f"{SMOL}.gguf"
    target_dir = cache_root() / "models" / SMOL
    ready = (
        find_binary() is not None
        and (eagle3.vendored_source() / "convert_hf_to_gguf.py").is_file()
        and eagle3.has_sentencepiece()
        and target_gguf.is_file()
        and (target_dir / "config.json").is_file()
    )
    return (target_gguf, target_dir) if ready else None


@pytest.mark.skipif(_real_setup() is None, reason="needs llama-server, its source, sentencepiece")
def test_real_eagle3_drafting_keeps_greedy_output(tmp_path):
    from specpilot.bench.llama_server import LlamaServer, completion_request, find_binary
    from specpilot.config import SamplingConfig
    from specpilot.drafting.eagle_head import EagleHead

    target_gguf, target_dir = _real_setup()
    draft = tmp_path / "head.gguf"
    eagle3.convert(EagleHead.load(COMMITTED_HEADS / SMOL), target_dir, draft)
    request = completion_request([1, 9690, 198, 2683, 359, 253, 5356], 16, SamplingConfig(), 0)
    outputs, counts = [], []
    for options, md in (({}, None), ({"spec": "eagle3"}, draft)):
        server = LlamaServer(find_binary(), peer.server_args(target_gguf, 2, options, md))
        try:
            done = server.complete(request)
        finally:
            server.close()
        outputs.append(done.token_ids)
        counts.append(peer.draft_counts(done.timings))
    plain, drafted = outputs
    assert len(plain) == 16 and drafted == plain
    assert counts[0] == (0, 0) and 0 <= counts[1][1] <= counts[1][0] and counts[1][0] > 0
