"""The runner protocol (models.runner) on llama.cpp's ggml kernels, over a GGUF file as stored.

One llama.cpp context holds one unified KV cache; batch slot s is llama sequence id s. A
forward over several slots is one `llama_decode`, so the (quantized) weights are read once for
every row; logits come back, as float32, only for the rows asked for. Rolling a slot back is
`llama_memory_seq_rm` on its id. Draft trees get temporary sequence ids past the slots'
(models.ggml.trees), released when the slot is next rolled back.

`run_batch` also returns the hidden states after chosen layers (`tap_layers`), which the eagle
drafter reads, once `enable_taps` has given the context an eval callback (models.ggml.taps).
Every row of a forward is checked before any sequence changes, so a refused forward leaves the
cache as it was. An early exit is a runner of its own over a truncated copy of the GGUF
(models.ggml.early_exit). The runner has no LM-head rows or layer-split forwards, and no
last-layer hidden states (llama.cpp keeps only the scored rows past the last layer): methods that
need those (DVI, a reduced draft vocabulary) run on the torch backend.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from specpilot.errors import ConfigError, ModelLoadError, PromptError
from specpilot.models.ggml import trees as tree_seqs
from specpilot.models.ggml.batch import Batch, Entry
from specpilot.models.ggml.config import KV_TYPES, GgmlConfig
from specpilot.models.ggml.early_exit import early_exit_gguf
from specpilot.models.ggml.library import default_threads, lib, recent_errors
from specpilot.models.ggml.taps import LayerTaps
from specpilot.models.runner import LogitRows, RunnerOutput
from specpilot.models.synced_cache import CachedTokens

TREE_LEAVES_PER_SLOT = 16
"""Temporary sequence ids reserved per slot for draft-tree leaves (llama.cpp allows 256 ids in
all, and reserves a logit row per id)."""


class GgmlRunner:
    """A CausalRunner over one GGUF file (module docstring)."""

    backend = "ggml"
    supports_trees = True
    dtype = torch.float32
    """The logits' dtype (the weights stay as the GGUF stores them)."""
    device = torch.device("cpu")

    def __init__(
        self,
        path: str | Path,
        max_length: int | None = 4096,
        batch_size: int = 1,
        config: GgmlConfig | None = None,
        torch_dtype: torch.dtype = torch.float32,
    ):
        """`torch_dtype`: what torch modules reading this target (an eagle head) compute in."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.config = config = config or GgmlConfig()
        self.path = Path(path)
        self.torch_dtype = torch_dtype
        self._llama = llama = lib()
        self._taps: LayerTaps | None = None
        params = llama.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = config.repack
        self._model = llama.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load {self.path}: {recent_errors()}")
        self._context = None
        self._batch = Batch(llama)
        vocab = llama.llama_model_get_vocab(self._model)
        self.vocab_size = llama.llama_vocab_n_tokens(vocab)
        self.num_layers = llama.llama_model_n_layer(self._model)
        self.hidden_size = llama.llama_model_n_embd(self._model)
        limit = llama.llama_model_n_ctx_train(self._model)
        self.max_length = min(limit, max_length) if max_length else limit
        self.batch_size = batch_size
        wanted = batch_size * (1 + TREE_LEAVES_PER_SLOT)
        self.num_seqs = min(llama.llama_max_parallel_sequences(), wanted)
        if self.num_seqs <= batch_size:
            raise ConfigError(f"llama.cpp decodes at most {self.num_seqs - 1} slots together")
        self._open_context()

    def _open_context(self) -> None:
        """A new llama.cpp context with an empty cache."""
        self._context = self._new_context()
        self._memory = self._llama.llama_get_memory(self._context)
        self.lengths = [0] * self.batch_size
        self.cached = CachedTokens(self.batch_size)
        self._trees: dict[int, tree_seqs.TreeSeqs] = {}
        self._free_ids = list(range(self.batch_size, self.num_seqs))

    def enable_taps(self) -> None:
        """Let forwards tap hidden states (`run_batch`'s `tap_layers`): the context is created
        again with the eval callback, so the cache is emptied. Done once, by a feature drafter
        when it is built; later forwards call it per graph node, at no measurable cost (taps
        module)."""
        if self._taps is None:
            self._taps = LayerTaps(self._llama)
            self._llama.llama_free(self._context)
            self._context = None  # `close` must not free it again if the new one fails
            self._open_context()

    def _new_context(self):
        llama, config = self._llama, self.config
        params = llama.llama_context_default_params()
        params.n_ctx = self.max_length * self.batch_size  # a row's tree fits in its own room
        params.n_batch = params.n_ctx  # any forward is one llama_decode
        params.n_ubatch = min(config.n_ubatch, params.n_ctx)
        params.n_seq_max = self.num_seqs
        params.kv_unified = True  # one cache: trees share the prefix cells by sequence id
        threads = config.n_threads or default_threads()
        params.n_threads = params.n_threads_batch = threads
        params.type_k = params.type_v = KV_TYPES[config.kv_type]
        if config.flash_attn is not None:
            params.flash_attn_type = (
                llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
                if config.flash_attn
                else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
        params.no_perf = True
        if self._taps is not None:
            params.cb_eval = self._taps.callback
        context = llama.llama_init_from_model(self._model, params)
        if not context:
            raise ModelLoadError(f"llama.cpp could not create a context: {recent_errors()}")
        return context

    def close(self) -> None:
        """Free the context and model now (else when the runner is collected)."""
        self._batch.free()
        if self._context:
            self._llama.llama_free(self._context)
            self._context = None
        if self._model:
            self._llama.llama_model_free(self._model)
            self._model = None

    def __del__(self):
        if getattr(self, "_llama", None) is not None:
            self.close()

    def early_exit(self, num_layers: int) -> GgmlRunner:
        """The first `num_layers` layers, then this model's final norm and LM head, as a runner
        of its own over a GGUF written once (models.ggml.early_exit: llama.cpp cannot stop a
        graph part-way, so the weights are a copy, not shared as on torch)."""
        if not 1 <= num_layers <= self.num_layers:
            raise ValueError(f"early exit needs 1..{self.num_layers} layers, got {num_layers}")
        path = early_exit_gguf(self.path, num_layers)
        return GgmlRunner(path, self.max_length, self.batch_size, self.config, self.torch_dtype)

    # -- cache -------------------------------------------------------------------------------
    @property
    def length(self) -> int:
        return self.lengths[0]

    def rollback(self, length: int, slot: int = 0) -> None:
        self._release_tree(slot)
        if length < self.lengths[slot]:
            self._llama.llama_memory_seq_rm(self._memory, slot, max(length, 0), -1)
            self.lengths[slot] = max(length, 0)
        self.cached.trim(slot, length)

    def reset(self) -> None:
        for slot in list(self._trees):
            self._release_tree(slot)
        self._llama.llama_memory_clear(self._memory, True)
        self.lengths = [0] * self.batch_size
        self.cached.clear()

    def keep_path(self, slot: int, start: int, path: tuple[int, ...]) -> None:
        """After a tree fed with its root at `start`: keep the accepted nodes `path` in the
        slot (they sit at chain positions already); the caller then rolls back."""
        tree = self._trees.get(slot)
        if tree is None or tree.start != start:
            raise RuntimeError(f"slot {slot} holds no draft tree rooted at position {start}")
        tree_seqs.keep(self._llama, self._memory, slot, tree, path)
        self.lengths[slot] = start + 1 + len(path)

    def _release_tree(self, slot: int) -> None:
        tree = self._trees.pop(slot, None)
        if tree is not None:
            self._free_ids += tree_seqs.release(self._llama, self._memory, tree)

    # -- forward -----------------------------------------------------------------------------
    def forward(self, input_ids: list[int], logits: LogitRows = "all") -> torch.Tensor | None:
        return self.forward_batch([list(input_ids)], [0], logits)[0]

    def forward_batch(
        self,
        rows: list[list[int]],
        slots: list[int],
        logits: LogitRows = "all",
        head: torch.Tensor | None = None,
        trees: list[tuple[int, ...] | None] | None = None,
    ) -> list[torch.Tensor | None]:
        """Per row its logits from `run_batch` (None for "none" or an empty row)."""
        if head is not None:
            raise ConfigError("the ggml backend scores the full vocabulary only (no draft head)")
        outs = self.run_batch(rows, slots, logits=logits, trees=trees)
        return [out and out.logits for out in outs]

    def run_batch(
        self,
        rows: list[list[int]],
        slots: list[int],
        *,
        logits: LogitRows = "all",
        tap_layers: tuple[int, ...] = (),
        trees: list[tuple[int, ...] | None] | None = None,
    ) -> list[RunnerOutput | None]:
        """Append rows[j] to slot slots[j] in one llama_decode. Per row (None for an empty one):
        [rows, vocab] float32 logits ("all", "last"; None for "none") and, for each k of
        `tap_layers` (1..layers − 1; `enable_taps` first), the [n, hidden] float32 hidden states
        after the first k layers; `hidden` is None (module docstring). trees[j] (parent indices):
        row j is [root, node 0, node 1, ...] of a draft tree (see `keep_path`)."""
        if len(set(slots)) != len(slots) or not all(0 <= s < self.batch_size for s in slots):
            raise ValueError(f"slots must be distinct and in 0..{self.batch_size - 1}: {slots}")
        self._check_taps(tap_layers)
        trees_ = trees if trees is not None else [None] * len(rows)
        live = [j for j, row in enumerate(rows) if len(row)]
        for j in live:
            self._check(rows[j], slots[j])
        for j in live:
            self._release_tree(slots[j])
        needed = sum(len(tree_seqs.leaves(trees_[j])) for j in live if trees_[j] is not None)
        if needed > len(self._free_ids):
            raise RuntimeError(
                f"draft trees with {needed} leaves need more sequence ids than llama.cpp has "
                f"left ({len(self._free_ids)}); draft smaller trees or decode fewer rows together"
            )
        entries: list[Entry] = []
        outputs: list[int] = []  # scored rows per live row
        for j in live:
            before = len(entries)
            entries += self._entries(rows[j], slots[j], trees_[j], logits)
            outputs.append(sum(entry.output for entry in entries[before:]))
        out: list[RunnerOutput | None] = [None] * len(rows)
        if not live:
            return out
        if tap_layers:
            self._taps.start(tap_layers)
        status = self._llama.llama_decode(self._context, self._batch.fill(entries))
        if status != 0:
            for j in live:
                self._release_tree(slots[j])
            raise RuntimeError(f"llama_decode failed (status {status}): {recent_errors()}")
        for j in live:
            tree = self._trees.get(slots[j])
            self.lengths[slots[j]] += 1 if tree is not None else len(rows[j])
        taps = self._taps.finish() if tap_layers else {}
        scored = None if logits == "none" else self._logits(sum(outputs))
        offset = first = 0  # the row's first scored row, its first token
        for j, n in zip(live, outputs, strict=True):
            rows_taps = {k: tap[first : first + len(rows[j])] for k, tap in taps.items()}
            row_logits = None if scored is None else scored[offset : offset + n]
            out[j] = RunnerOutput(row_logits, None, rows_taps)
            offset, first = offset + n, first + len(rows[j])
        return out

    def _check_taps(self, layers: tuple[int, ...]) -> None:
        if layers and self._taps is None:
            raise RuntimeError("this runner's forwards cannot tap hidden states: enable_taps()")
        if not all(1 <= k < self.num_layers for k in layers):
            raise ValueError(f"tap layers must lie in 1..{self.num_layers - 1}, got {layers}")

    def _check(self, row: list[int], slot: int) -> None:
        if self.lengths[slot] + len(row) > self.max_length:
            raise PromptError(
                f"sequence of {self.lengths[slot] + len(row)} tokens exceeds the context of "
                f"{self.max_length}; use a shorter prompt or fewer new tokens"
            )
        if not all(0 <= token < self.vocab_size for token in row):
            raise ValueError(f"token ids must be in 0..{self.vocab_size - 1}")

    def _entries(self, row, slot: int, parents, logits: LogitRows) -> list[Entry]:
        """The batch entries of one row: a chain in the slot's sequence, or a tree whose nodes
        carry temporary sequence ids (models.ggml.trees)."""
        start, n = self.lengths[slot], len(row)
        scored = [logits == "all" or (logits == "last" and i == n - 1) for i in range(n)]
        if parents is None:
            return [Entry(t, start + i, (slot,), scored[i]) for i, t in enumerate(row)]
        if len(parents) != n - 1:
            raise ValueError(f"a tree row holds its root and {len(parents)} nodes, got {n} tokens")
        tree = tree_seqs.plan(tuple(parents), start, self._free_ids)
        self._trees[slot] = tree
        for seq in tree.leaf_ids:  # the committed prefix, visible to every path
            self._llama.llama_memory_seq_cp(self._memory, slot, seq, -1, -1)
        root = Entry(row[0], start, (slot, *tree.leaf_ids), scored[0])
        return [root] + [
            Entry(token, start + depth, seqs, scored[i + 1])
            for i, (token, depth, seqs) in enumerate(
                zip(row[1:], tree.depths, tree.node_seqs, strict=True)
            )
        ]

    def _logits(self, rows: int) -> torch.Tensor:
        """The decode's scored rows, in batch order, copied out of llama.cpp's buffer."""
        pointer = self._llama.llama_get_logits(self._context)
        view = np.ctypeslib.as_array(pointer, shape=(rows, self.vocab_size))
        return torch.from_numpy(view.copy())
