"""Token-embedding rows of a GGUF file as stored, dequantized on demand.

The eagle head joins the target's embedding of the next token to each feature; a ggml target
keeps its weights inside llama.cpp, so the rows are read from the GGUF itself. Why on demand:
the 1.5B's Q4_K `token_embd` (151,936 × 1536) dequantizes to 0.9 GB of float32 in ~4 s, while a
drafting step needs a few rows (~0.1-0.2 ms per call for 1-4 rows, measured on a loaded 2-core
host); the rows read are kept, so a sequence's recurring tokens cost nothing after the first.
ggml's own GGUF reader (libggml-base) finds the tensor in ~40 ms where the `gguf` package's
reader parses every metadata string first (~7 s for a 150k-token vocabulary); the `gguf`
package's `dequantize` then decodes the rows exactly as llama.cpp's reference code does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from specpilot.errors import ModelLoadError
from specpilot.models.ggml.library import GgufParams, ggml_base

TOKEN_EMBEDDING = "token_embd.weight"


class GgufEmbedding:
    """The rows of one GGUF's token embedding (`rows`), read through a memory map."""

    def __init__(self, path: str | Path, hidden_size: int):
        ggml = ggml_base()
        context = ggml.gguf_init_from_file(str(path).encode(), GgufParams(True, None))
        if not context:
            raise ModelLoadError(f"{path} is not a readable GGUF file")
        try:
            index = ggml.gguf_find_tensor(context, TOKEN_EMBEDDING.encode())
            if index < 0:
                raise ModelLoadError(f"{path} has no {TOKEN_EMBEDDING} tensor")
            offset = ggml.gguf_get_data_offset(context)
            offset += ggml.gguf_get_tensor_offset(context, index)
            size = ggml.gguf_get_tensor_size(context, index)
            self.qtype = GGMLQuantizationType(ggml.gguf_get_tensor_type(context, index))
        finally:
            ggml.gguf_free(context)
        block, block_bytes = GGML_QUANT_SIZES[self.qtype]
        row_bytes = hidden_size // block * block_bytes
        self.hidden_size = hidden_size
        self._data = np.memmap(path, np.uint8, "r", offset, (size // row_bytes, row_bytes))
        self._rows: dict[int, torch.Tensor] = {}

    @property
    def vocab_size(self) -> int:
        return self._data.shape[0]

    def rows(self, ids: list[int]) -> torch.Tensor:
        """[len(ids), hidden] float32 embedding rows."""
        missing = sorted(set(ids) - self._rows.keys())
        if missing:
            values = dequantize(np.ascontiguousarray(self._data[missing]), self.qtype)
            rows = torch.from_numpy(values.reshape(len(missing), self.hidden_size))
            self._rows.update(zip(missing, rows, strict=True))
        return torch.stack([self._rows[i] for i in ids])
