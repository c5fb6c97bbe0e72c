"""The `llama-cpp:spec=eagle3` peer's draft: specpilot's eagle head as llama.cpp's EAGLE3 GGUF.

The head is exported in the EAGLE-3 format (drafting.eagle3_format) and converted by the
llama.cpp converter vendored with llama-cpp-python (`convert_hf_to_gguf.py --target-model-dir`,
the source scripts/build_llama_cpp.sh unpacks), once per head content, llama.cpp version and
target, into $SPECPILOT_CACHE/eagle3-gguf/. llama.cpp then drafts with the same weights through
its own `draft-eagle3`: one chain of up to `--spec-draft-n-max` (default 3) tokens, each the
draft's top token (common/speculative.cpp).

What this llama.cpp refuses, checked before anything is converted or started (docs/guides/
eagle3.md has the measured runs):
- a head with a q/k/v bias: src/models/eagle3.cpp creates no bias tensors, so loading the draft
  fails with `done_getting_tensors: wrong number of tensors` (src/llama-model-loader.cpp);
- a Qwen2 target: src/models/qwen2.cpp records no layer inputs, so the layer taps draft-eagle3 asks
  for (`llama_set_embeddings_layer_inp`) abort the server (GGML_ASSERT `layer input tensor is
  null`, src/llama-graph.cpp, `llm_graph_result::set_outputs`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from specpilot.bench.llama_server import BUILD_HINT, LLAMA_CPP_VERSION, build_root
from specpilot.errors import ConfigError

METHOD = "llama-cpp:spec=eagle3"
NO_LAYER_INPUTS = ("qwen2",)
"""Target model types whose llama.cpp graph (src/models/<type>.cpp) records no layer inputs."""
CONVERTER_NEEDS = "sentencepiece>=0.1.98,<0.3.0"
"""The converter imports sentencepiece before it looks for a BPE tokenizer (conversion/base.py)."""


def vendored_source() -> Path:
    """The llama.cpp tree scripts/build_llama_cpp.sh unpacks (the converter and gguf-py)."""
    source = build_root() / "src" / f"llama_cpp_python-{LLAMA_CPP_VERSION}"
    return source / "vendor" / "llama.cpp"


def refusals(shape) -> list[str]:
    """Why this llama.cpp cannot draft with a head of this EagleShape (empty: it can)."""
    reasons = []
    if shape.attention_bias:
        reasons.append(
            "the head has a q/k/v bias, and llama.cpp's EAGLE3 model loads none (src/models/"
            "eagle3.cpp; the draft fails with 'done_getting_tensors: wrong number of tensors'): "
            "train a bias-free head with `specpilot train-eagle --no-qkv-bias`"
        )
    if shape.model_type in NO_LAYER_INPUTS:
        reasons.append(
            f"llama.cpp's {shape.model_type} graph records no layer inputs, so draft-eagle3's "
            "taps abort the server (GGML_ASSERT 'layer input tensor is null' in src/llama-graph."
            "cpp); it needs a target whose graph records them (Llama, Qwen3, ...)"
        )
    return reasons


def head_key(head_folder: Path, target_name: str) -> str:
    """The cache key of a converted head: its files' content, the target and llama.cpp's version."""
    from specpilot.drafting.eagle_head import CONFIG_FILE, WEIGHTS_FILE

    digest = hashlib.sha256(f"{LLAMA_CPP_VERSION}\0{target_name}\0".encode())
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        with open(head_folder / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def draft_gguf(head_option: str | None, target_name: str, target_dir: Path) -> Path:
    """The EAGLE3 GGUF of the head `head_option` (folder or committed name; None: the target's
    committed head) for the target `target_name` whose HF config and tokenizer are in
    `target_dir`; converted on first use, a ConfigError when llama.cpp cannot run it."""
    from specpilot.drafting.eagle_head import EagleHead, resolve_head
    from specpilot.files import cache_root, file_name

    folder = resolve_head(head_option, target_name)
    head = EagleHead.load(folder)
    reasons = refusals(head.shape)
    if reasons:
        raise ConfigError(
            f"{METHOD}: llama.cpp {LLAMA_CPP_VERSION} cannot run {folder}: " + "; ".join(reasons)
        )
    safe = file_name(Path(target_name).name)
    out = cache_root() / "eagle3-gguf" / f"{safe}-{head_key(folder, target_name)}.gguf"
    if not out.is_file():
        convert(head, target_dir, out)
    return out


def has_sentencepiece() -> bool:
    return importlib.util.find_spec("sentencepiece") is not None


def converter_command(head_dir: Path, target_dir: Path, outfile: Path) -> list[str]:
    converter = vendored_source() / "convert_hf_to_gguf.py"
    return [
        sys.executable,
        str(converter),
        str(head_dir),
        "--target-model-dir",
        str(target_dir),
        "--outfile",
        str(outfile),
    ]


def convert(head, target_dir: Path, out: Path) -> None:
    """Export `head` as EAGLE-3 and convert it with the vendored converter into `out`."""
    from specpilot.drafting.eagle3_format import export_eagle3

    source = vendored_source()
    if not (source / "convert_hf_to_gguf.py").is_file():
        raise ConfigError(
            f"{METHOD} converts the head with llama.cpp's convert_hf_to_gguf.py, missing from "
            f"{source}; `{BUILD_HINT}` unpacks it"
        )
    if not has_sentencepiece():
        raise ConfigError(
            f"{METHOD}: llama.cpp's converter imports sentencepiece; "
            f"pip install '{CONVERTER_NEEDS}'"
        )
    target_config = json.loads((target_dir / "config.json").read_text())
    out.parent.mkdir(parents=True, exist_ok=True)
    python_path = [str(source / "gguf-py"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, python_path))}
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".convert.") as tmp:
        head_dir = export_eagle3(head, target_config, Path(tmp) / "head", torch.bfloat16)
        written = Path(tmp) / "head.gguf"
        done = subprocess.run(
            converter_command(head_dir, target_dir, written),
            capture_output=True,
            text=True,
            env=env,
        )
        if done.returncode != 0 or not written.is_file():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise ConfigError(f"{METHOD}: llama.cpp's converter failed on the head:\n{tail}")
        os.replace(written, out)
