"""Hidden states after chosen layers of a llama.cpp forward, through the scheduler's eval callback.

Why not `llama_set_embeddings_layer_inp`: libllama exports it (with C++ linkage), but only some
architectures' graphs record their layer inputs; Qwen2's does not, and asking for one there
aborts the process (GGML_ASSERT in `llm_graph_result::set_outputs`). Every Llama/Qwen2/Mistral
graph names each layer's output `l_out-<i>`, and a context created with `cb_eval` calls it for
every graph node, first asking whether the caller wants the node (the scheduler then computes
the graph up to it) and then again with its data. So tap k, the hidden state after the first k
layers (the input of layer k), is node `l_out-<k - 1>`: float32 [tokens, hidden] for every token
of the micro-batch (only the last layer's output is cut to the scored rows, so k < layers), and
micro-batches come in batch order (a unified KV cache splits a batch into consecutive pieces).

The callback is a Python call per graph node (~960 in a 1.5B Qwen2 step), so a runner creates its
context with it only once a feature drafter asks (`GgmlRunner.enable_taps`); it copies a node's
data only in forwards that tap that layer. Measured cost of the calls in forwards that tap
nothing: −0.16 and +0.28 ms on a ~33 ms one-token step of the 1.5B (two runs, EPYC, 2 threads;
scripts/bench/ggml/taps_cost.py), within the step's noise.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from specpilot.models.ggml.library import ggml_base

_F32 = 0  # ggml_type


class _Tensor(ctypes.Structure):
    """The leading fields of `struct ggml_tensor` (ggml.h), up to its name."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


_NAME_OFFSET = _Tensor.name.offset


def node_name(k: int) -> bytes:
    """The graph node holding tap k (the output of layer k − 1)."""
    return f"l_out-{k - 1}".encode()


class LayerTaps:
    """Collects the taps one `llama_decode` was asked for (`start` before it, `finish` after)."""

    def __init__(self, llama):
        self.callback = llama.ggml_backend_sched_eval_callback(self._eval)
        """Passed as the context's `cb_eval`; kept here so ctypes does not free it."""
        self._copy = ggml_base().ggml_backend_tensor_get
        self._wanted: dict[bytes, int] = {}
        self._parts: dict[int, list[np.ndarray]] = {}
        self._error: Exception | None = None

    def start(self, layers: tuple[int, ...]) -> None:
        self._wanted = {node_name(k): k for k in layers}
        self._parts = {k: [] for k in layers}
        self._error = None

    def finish(self) -> dict[int, torch.Tensor]:
        """Layer k → [tokens, hidden] float32 over the decode's whole batch, in batch order."""
        parts, error = self._parts, self._error
        self._wanted, self._parts, self._error = {}, {}, None
        if error is not None:
            raise RuntimeError(f"reading a hidden-state tap failed: {error}") from error
        return {k: torch.from_numpy(np.concatenate(rows)) for k, rows in parts.items() if rows}

    def _eval(self, pointer: int, ask: bool, _user) -> bool:
        if ask:
            return bool(self._wanted) and ctypes.string_at(pointer + _NAME_OFFSET) in self._wanted
        try:  # an exception escaping a ctypes callback would return False and stop the graph
            tensor = _Tensor.from_address(pointer)
            rows, width = tensor.ne[1], tensor.ne[0]
            if tensor.type != _F32 or tensor.nb[1] != 4 * width or tensor.ne[2] != 1:
                raise ValueError(f"node {tensor.name!r} is not a contiguous float32 matrix")
            out = np.empty((rows, width), dtype=np.float32)
            self._copy(pointer, out.ctypes.data, 0, out.nbytes)
            self._parts[self._wanted[tensor.name]].append(out)
        except Exception as error:  # noqa: BLE001 - re-raised by `finish`
            self._error = error
        return True
