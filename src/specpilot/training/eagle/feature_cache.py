"""The target's teacher-forced features of training sequences, kept on disk (`--feature-cache`).

A head trains for several epochs over the same sequences and is evaluated on the same held-out
ones every few updates, and PPOW's ADAW rescores every sequence at each refresh; the target is
frozen, so its taps and last hidden states at every position are the same each time. On a CPU
without native bf16 (float32) the prefill that recomputes them took 59 % of a distillation update
for SmolLM2-135M (README, train-eagle). Each sequence's features are stored once, exactly as the
runner produced them (its dtype), so a cached run trains on the same numbers as one without.

PPOW's rollouts also need the target's KV cache of each sequence (the target judges windows
that continue its prefixes): where the runner can export it (`cache_state`), the whole sequence's
keys and values are kept too, in a file of their own, and a rollout loads them and cuts them at
its prefix instead of prefilling the prefix. A cut there equals a prefill of the prefix alone up
to the rounding of the longer forward (causal attention: a position sees only its past).

Entries are addressed by content: a folder per target identity (architecture, dtype, tap layers
and a fingerprint of its weights) holding one safetensors file per token sequence, named by a
hash of its ids. Another target, dtype or tap choice therefore never reads them, and a cut or
changed sample is simply another entry. Files are written atomically (temp file, rename); an
unreadable or mis-shaped one is recomputed and replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file


class FeatureCache:
    """Taps and last hidden states of token sequences for one target and one set of tap layers."""

    def __init__(self, folder: str | Path, runner, feature_layers: tuple[int, ...]):
        self.feature_layers = tuple(feature_layers)
        self.folder = Path(folder).expanduser() / target_identity(runner, feature_layers)
        self.folder.mkdir(parents=True, exist_ok=True)

    @classmethod
    def for_held_out(
        cls, cache: FeatureCache | None, runner, feature_layers: tuple[int, ...]
    ) -> FeatureCache:
        """Where a run keeps its held-out sequences' features: `cache` (the run's own), else a
        scratch folder deleted with the returned cache. A run scores the same held-out answers
        every few updates; without this each score prefilled them again (2-core Xeon, the 1.5B in
        float32: the 56 answers of `--valid-responses` took 136 s a score, three updates)."""
        if cache is not None:
            return cache
        scratch = tempfile.TemporaryDirectory(prefix="specpilot-held-out-")
        held_out = cls(scratch.name, runner, feature_layers)
        held_out._scratch = scratch  # the folder goes when the cache is collected
        return held_out

    def _path(self, ids: list[int], kind: str = "") -> Path:
        digest = hashlib.sha256(torch.tensor(ids, dtype=torch.int64).numpy().tobytes())
        return self.folder / f"{digest.hexdigest()[:40]}{kind}.safetensors"

    def load(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(taps [n, layers · h], hidden [n, h]) of `ids` (n = len(ids) − 1), None if absent or
        unreadable."""
        return self._read(self._path(ids), ("taps", "hidden"), 0, len(ids) - 1)

    def store(self, ids: list[int], taps: torch.Tensor, hidden: torch.Tensor) -> None:
        self._write(self._path(ids), {"taps": taps, "hidden": hidden})

    def load_kv(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The target's (keys, values) after a prefill of `ids` ([layers, kv heads, len(ids),
        head dim] each), None if absent or unreadable."""
        return self._read(self._path(ids, ".kv"), ("keys", "values"), 2, len(ids))

    def store_kv(self, ids: list[int], keys: torch.Tensor, values: torch.Tensor) -> None:
        self._write(self._path(ids, ".kv"), {"keys": keys, "values": values})

    @staticmethod
    def _read(path: Path, names: tuple[str, str], axis: int, positions: int):
        """The two tensors `names` of a file if both hold `positions` positions along `axis`."""
        if not path.is_file():
            return None
        try:
            stored = load_file(path)
        except (SafetensorError, OSError, ValueError):
            return None
        tensors = tuple(stored.get(name) for name in names)
        if any(t is None or t.dim() <= axis or t.shape[axis] != positions for t in tensors):
            return None
        return tensors

    @staticmethod
    def _write(path: Path, tensors: dict[str, torch.Tensor]) -> None:
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        save_file({name: t.contiguous() for name, t in tensors.items()}, tmp)
        os.replace(tmp, path)


def target_identity(runner, feature_layers: tuple[int, ...]) -> str:
    """A folder name that changes with anything that changes the features: the architecture, the
    dtype, the tap layers, and the weights (a fingerprint of the embedding's first rows, the final
    norm and the last layer's output projection)."""
    fingerprint = hashlib.sha256()
    for tensor in (runner.embed[:16], runner.final_norm, runner.layers[-1].o[:16]):
        fingerprint.update(tensor.detach().float().cpu().numpy().tobytes())
    described = {
        "model_type": runner.config.model_type,
        "hidden_size": runner.config.hidden_size,
        "num_layers": runner.num_layers,
        "vocab_size": runner.vocab_size,
        "dtype": str(runner.dtype),
        "feature_layers": [int(k) for k in feature_layers],
        "weights": fingerprint.hexdigest(),
    }
    digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
    return f"{runner.config.model_type}-{str(runner.dtype).removeprefix('torch.')}-{digest[:16]}"
