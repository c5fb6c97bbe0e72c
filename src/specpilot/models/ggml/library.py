"""The llama.cpp library, bound once through llama-cpp-python's low-level ctypes module.

Why the low-level API and not the `Llama` class: the class keeps one sequence, copies every
logit row of every token and hides the KV cache's sequence ids, which batches, rollback and
tree verification need. `llama_cpp.llama_cpp` exposes libllama's C functions one to one.

llama.cpp logs through a callback; by default it writes every model-loading line to stderr.
Here only errors are kept, in a short buffer that exceptions quote (`recent_errors`).

`ggml_base` binds the few functions of libggml-base (loaded with libllama) that the binding
does not: reading a graph node's data (models.ggml.taps) and GGUF tensor offsets
(models.ggml.embedding).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from collections import deque
from functools import cache
from pathlib import Path

from specpilot.errors import ConfigError

PINNED_VERSION = "0.3.36"
"""The llama-cpp-python release install.sh builds; its binding's struct layouts are what this
package writes into."""
_LOG_ERROR = 4  # ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation
_errors: deque[str] = deque(maxlen=8)
_callback = None  # ctypes frees a callback nobody references; the library keeps calling it


def available() -> bool:
    """True when llama-cpp-python is importable (the ggml backend can run)."""
    return importlib.util.find_spec("llama_cpp") is not None


def default_threads() -> int:
    """The CPUs this process may run on (what llama.cpp's own tools default to, less hyper-
    threads it cannot see through an affinity mask)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _keep_errors(level: int, text: bytes, _user) -> None:
    if level == _LOG_ERROR and text:
        _errors.append(text.decode(errors="replace").strip())


@cache
def lib():
    """The `llama_cpp.llama_cpp` module, its backend initialised and its log routed (once)."""
    if not available():
        raise ConfigError(
            "the ggml backend needs llama-cpp-python: run `bash install.sh` (it builds "
            f"llama-cpp-python {PINNED_VERSION} for this CPU), or choose the torch backend",
            ("backend",),
        )
    import llama_cpp.llama_cpp as llama

    global _callback
    _callback = llama.llama_log_callback(_keep_errors)
    llama.llama_log_set(_callback, ctypes.c_void_p())
    llama.llama_backend_init()
    return llama


class GgufParams(ctypes.Structure):
    """`struct gguf_init_params` (gguf.h)."""

    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


@cache
def ggml_base() -> ctypes.CDLL:
    """libggml-base beside the libllama that `lib` loaded, with the signatures used here."""
    library = ctypes.CDLL(str(Path(lib()._lib._name).with_name("libggml-base.so")))
    c = ctypes
    signatures = {
        "ggml_backend_tensor_get": ([c.c_void_p, c.c_void_p, c.c_size_t, c.c_size_t], None),
        "gguf_init_from_file": ([c.c_char_p, GgufParams], c.c_void_p),
        "gguf_free": ([c.c_void_p], None),
        "gguf_find_tensor": ([c.c_void_p, c.c_char_p], c.c_int64),
        "gguf_get_data_offset": ([c.c_void_p], c.c_size_t),
        "gguf_get_tensor_offset": ([c.c_void_p, c.c_int64], c.c_size_t),
        "gguf_get_tensor_size": ([c.c_void_p, c.c_int64], c.c_size_t),
        "gguf_get_tensor_type": ([c.c_void_p, c.c_int64], c.c_int),
    }
    for name, (argtypes, restype) in signatures.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, restype
    return library


@cache
def multirow_kernels() -> bool:
    """True when the ggml library carries specpilot's multi-row K-quant kernels (install.sh
    builds it with patches/ggml): verifying n drafted tokens then unpacks each weight block once
    instead of n times, and gives the same results as n one-token forwards."""
    library = ctypes.CDLL(str(Path(lib()._lib._name).with_name("libggml-cpu.so")))
    return hasattr(library, "ggml_multirow_dot")


def recent_errors() -> str:
    """The last error lines llama.cpp logged (empty when none), and forget them."""
    text = " | ".join(_errors)
    _errors.clear()
    return text
