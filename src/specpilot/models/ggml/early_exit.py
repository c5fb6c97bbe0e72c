"""Early-exit models on the ggml backend: the first N layers of a GGUF, then its final norm and
LM head, written once as a GGUF of their own.

llama.cpp runs a model's graph whole, so an early exit cannot be a view of the loaded model as on
the torch backend (models.decoder.DecoderRunner.early_exit). It is a second GGUF instead: the
same metadata with the block count set to N, and the same tensors, byte for byte, less the
blocks from N on. That costs a copy of the embedding, the first N blocks and the head on disk
(kept in the cache, keyed on the source file) and in memory, but every kernel is llama.cpp's own.
SV's early-exit companions (methods.sv) are built this way on ggml.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from specpilot.errors import ModelLoadError
from specpilot.files import cache_root
from specpilot.models.offline import gguf_cache_dir, publish_permissions

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def early_exit_gguf(path: Path, num_layers: int) -> Path:
    """The GGUF of `path`'s first `num_layers` layers, written on first use (atomically)."""
    out = (
        cache_root() / "ggml" / "early_exit" / f"{gguf_cache_dir(path).name}-first{num_layers}.gguf"
    )
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    os.close(handle)
    try:
        _write_truncated(path, Path(tmp), num_layers)
        publish_permissions(Path(tmp))
        os.replace(tmp, out)
    except Exception as error:
        raise ModelLoadError(
            f"could not write the {num_layers}-layer exit of {path}: {error}"
        ) from error
    finally:
        Path(tmp).unlink(missing_ok=True)
    return out


def _write_truncated(source: Path, out: Path, num_layers: int) -> None:
    """Copy `source` to `out` with `num_layers` blocks: every metadata field (the block count
    changed) and every tensor outside the dropped blocks, as stored."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    block_count = f"{arch}.block_count"
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE:
            continue  # written by the writer itself
        value = num_layers if field.name == block_count else field.contents()
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    kept = [t for t in reader.tensors if not _dropped(t.name, num_layers)]
    for tensor in kept:
        writer.add_tensor_info(
            tensor.name,
            tensor.data.shape,
            tensor.data.dtype,
            tensor.data.nbytes,
            tensor.tensor_type,
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in kept:
        writer.write_tensor_data(tensor.data)
    writer.close()


def _dropped(name: str, num_layers: int) -> bool:
    match = _BLOCK.match(name)
    return match is not None and int(match.group(1)) >= num_layers
