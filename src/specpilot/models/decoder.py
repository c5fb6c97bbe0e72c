"""A lean decoder runner for the Llama/Qwen2 family (Llama, Qwen2/2.5, SmolLM2, Mistral).

Why own it: per-layer Python and framework overhead is a large share of a small model's step on
a CPU, and speculative decoding lives on the draft/target cost ratio. This runner keeps fused
weights (qkv, gate+up), a static KV cache where rollback is lowering a length, `torch.mv` for
single-token steps (oneDNN's bf16 GEMV streams weights slower than `mv`), and computes logits
only for the rows asked for. It also exposes what adaptive methods need: hidden states tapped
at any layer, a forward that starts or stops at layer k (layer-split self-drafting), explicit
position ids and an attention mask among the new tokens (tree verification).

It does not implement sliding-window attention or non-Llama architectures; `load_model` sends
those to the generic transformers adapter. Invariant: layer i's cache holds `lengths[i]`
positions; a forward over layers [a, b) requires them all at one length and advances them by n.

Batching: the cache has `batch_size` slots, each with its own lengths. `forward_batch` packs
every row's new tokens (ragged: any number per row) into one matrix, so each weight matrix is
streamed once for the whole batch, and runs attention row by row against that row's slot. No
padding is computed and rows never see each other's positions.
Its float32 logits match transformers' for the same weights (tests/unit/test_decoder.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specpilot.errors import PromptError
from specpilot.models.gemm import GemmPlan, linear, plan_for
from specpilot.models.runner import LogitRows, RunnerOutput
from specpilot.models.synced_cache import CachedTokens
from specpilot.tree import tree_depths, tree_mask

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")

LM_HEAD_PLAN_ROWS = 16
"""Rows the LM head's plan covers: a step scores its verified rows only (1 for a plain step, a
chain or tree of ≤ 16), and timing the largest weight for 48 row counts took 70 s in float32."""


@dataclass
class _Segment:
    """One row of a packed forward: its cache slot, first position, rows in the packed input,
    rotary tables and additive attention mask (None for a lone causal token)."""

    slot: int
    start: int
    rows: slice
    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor | None


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def supports(config) -> bool:
    """True when this runner reproduces the architecture exactly."""
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(config, "mlp_bias", False):
        return False
    window = getattr(config, "sliding_window", None)
    return not (getattr(config, "use_sliding_window", window is not None) and window)


class DecoderRunner:
    """Static-KV-cache decoder built from a loaded transformers Llama/Qwen2 model's weights."""

    backend = "torch"
    supports_trees = True
    """forward_batch takes draft trees, and keep_path compacts the cache after one."""

    def __init__(self, hf_model, max_length: int | None = None, batch_size: int = 1):
        config = hf_model.config
        if not supports(config):
            raise ValueError(f"DecoderRunner does not support model_type={config.model_type!r}")
        inner = hf_model.model
        self.config = config
        self.dtype = inner.embed_tokens.weight.dtype
        self.device = inner.embed_tokens.weight.device
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = config.rms_norm_eps
        limit = config.max_position_embeddings
        self.max_length = min(limit, max_length) if max_length else limit
        self.embed = inner.embed_tokens.weight.detach()
        self.final_norm = inner.norm.weight.detach()
        self.lm_head = hf_model.lm_head.weight.detach()
        self.vocab_size = self.lm_head.shape[0]
        self.layers = [self._fuse(layer) for layer in inner.layers]
        self.gemm_plans: dict[str, GemmPlan | None] = {
            name: plan_for(getattr(self.layers[0], name)) if self.layers else None
            for name in ("gate_up", "down")
        }
        self.gemm_plans["lm_head"] = plan_for(self.lm_head, LM_HEAD_PLAN_ROWS)
        """How this CPU multiplies the MLP's weights and the LM head (most of a step's weight
        bytes) by a few rows fastest (models.gemm), one plan per product: the best layout
        differs by shape."""
        rotary = inner.rotary_emb
        positions = torch.arange(self.max_length, device=self.device, dtype=torch.float32)
        freqs = torch.outer(positions, rotary.inv_freq.float().to(self.device))
        angles = torch.cat([freqs, freqs], dim=-1)
        scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.cos = (angles.cos() * scale).to(self.dtype)  # [max_length, head_dim]
        self.sin = (angles.sin() * scale).to(self.dtype)
        self._allocate_cache(batch_size)

    def _allocate_cache(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        shape = (self.num_layers, batch_size, self.num_kv_heads, self.max_length, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.slot_lengths = [[0] * self.num_layers for _ in range(batch_size)]
        self.cached = CachedTokens(batch_size)

    def early_exit(self, num_layers: int) -> DecoderRunner:
        """The first `num_layers` layers, then this model's final norm and LM head: a cheap
        early-exit model sharing these weights (no copy) with a KV cache of its own."""
        if not 1 <= num_layers <= self.num_layers:
            raise ValueError(f"early exit needs 1..{self.num_layers} layers, got {num_layers}")
        view = copy.copy(self)
        view.layers = self.layers[:num_layers]
        view.num_layers = num_layers
        view._allocate_cache(self.batch_size)
        return view

    @staticmethod
    def _fuse(layer) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        has_bias = attn.q_proj.bias is not None
        return _Layer(
            input_norm=layer.input_layernorm.weight.detach(),
            qkv=torch.cat([p.weight.detach() for p in projections]),
            qkv_bias=torch.cat([p.bias.detach() for p in projections]) if has_bias else None,
            o=attn.o_proj.weight.detach(),
            o_bias=None if attn.o_proj.bias is None else attn.o_proj.bias.detach(),
            post_norm=layer.post_attention_layernorm.weight.detach(),
            gate_up=torch.cat([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()]),
            down=mlp.down_proj.weight.detach(),
        )

    @property
    def streamed_bytes(self) -> int:
        """Bytes of weights one decode step must read (all layers, final norm, LM head; the
        embedding contributes one row): weight bytes ÷ memory bandwidth is the roofline time."""
        tensors = [self.final_norm, self.lm_head]
        for layer in self.layers:
            tensors += [t for t in vars(layer).values() if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    # -- cache -------------------------------------------------------------------------------
    @property
    def lengths(self) -> list[int]:
        """Per-layer cached lengths of slot 0 (the single-sequence API)."""
        return self.slot_lengths[0]

    @property
    def length(self) -> int:
        return self.lengths[-1]

    def rollback(self, length: int, layers: range | None = None, slot: int = 0) -> None:
        lengths = self.slot_lengths[slot]
        for i in layers if layers is not None else range(self.num_layers):
            lengths[i] = min(lengths[i], length)
        self.cached.trim(slot, length)

    def reset(self) -> None:
        self.slot_lengths = [[0] * self.num_layers for _ in range(self.batch_size)]
        self.cached.clear()

    def cache_state(self, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of `slot`'s keys and values at positions [0, length) (each [layers, kv heads,
        length, head dim]): a prefill kept to be restored later with `load_cache_state`."""
        if min(self.slot_lengths[slot]) < length:
            raise ValueError(
                f"slot {slot} holds {min(self.slot_lengths[slot])} < {length} positions"
            )
        return (
            self.k_cache[:, slot, :, :length].clone(),
            self.v_cache[:, slot, :, :length].clone(),
        )

    def load_cache_state(self, slot: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Make `slot` hold the positions of a `cache_state` (of this model and dtype)."""
        expected = (self.num_layers, self.num_kv_heads, keys.shape[2], self.head_dim)
        if keys.shape != expected or values.shape != expected or keys.shape[2] > self.max_length:
            raise ValueError(
                f"a cache state of shape {tuple(keys.shape)} does not fit this model's cache "
                f"(layers, kv heads, positions <= {self.max_length}, head dim) = {expected}"
            )
        length = keys.shape[2]
        self.k_cache[:, slot, :, :length] = keys.to(self.k_cache)
        self.v_cache[:, slot, :, :length] = values.to(self.v_cache)
        self.slot_lengths[slot] = [length] * self.num_layers
        self.cached.trim(slot, 0)

    # -- math --------------------------------------------------------------------------------
    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * xf.to(x.dtype)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _attention(self, i: int, layer: _Layer, x, segments: list[_Segment]) -> torch.Tensor:
        qkv = linear(x, layer.qkv, layer.qkv_bias)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        outs = [self._segment_attention(i, qkv[seg.rows], seg, q_size, kv_size) for seg in segments]
        attended = outs[0] if len(outs) == 1 else torch.cat(outs)
        return linear(attended, layer.o, layer.o_bias)

    def _segment_attention(self, i: int, qkv, seg: _Segment, q_size: int, kv_size: int):
        """One row's new tokens attend to its own slot: write its keys/values, then attend."""
        n = qkv.shape[0]
        q = qkv[:, :q_size].view(n, self.num_heads, self.head_dim).transpose(0, 1)
        k = (
            qkv[:, q_size : q_size + kv_size]
            .view(n, self.num_kv_heads, self.head_dim)
            .transpose(0, 1)
        )
        v = qkv[:, q_size + kv_size :].view(n, self.num_kv_heads, self.head_dim).transpose(0, 1)
        q, k = self._rope(q, seg.cos, seg.sin), self._rope(k, seg.cos, seg.sin)
        end = seg.start + n
        k_cache, v_cache = self.k_cache[i, seg.slot], self.v_cache[i, seg.slot]
        k_cache[:, seg.start : end] = k
        v_cache[:, seg.start : end] = v
        # Fold each GQA group into the query axis ([kv_heads, group * n, head_dim]) so attention
        # reads the cache once per kv head, without expanding keys/values per query head.
        group = self.num_heads // self.num_kv_heads
        grouped_q = q.reshape(self.num_kv_heads, group * n, self.head_dim)
        out = F.scaled_dot_product_attention(
            grouped_q[None],
            k_cache[:, :end][None],
            v_cache[:, :end][None],
            attn_mask=None if seg.mask is None else seg.mask.repeat(group, 1),
        )  # [1, kv_heads, group * n, head_dim]
        return out[0].reshape(self.num_heads, n, self.head_dim).transpose(0, 1).reshape(n, q_size)

    def _layer(self, i: int, x, segments: list[_Segment]) -> torch.Tensor:
        layer = self.layers[i]
        x = x + self._attention(i, layer, self._rms_norm(x, layer.input_norm), segments)
        normed = self._rms_norm(x, layer.post_norm)
        gate, up = linear(normed, layer.gate_up, None, self.gemm_plans["gate_up"]).chunk(2, dim=-1)
        return x + linear(F.silu(gate) * up, layer.down, None, self.gemm_plans["down"])

    def logits_from_hidden(
        self, hidden: torch.Tensor, head: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[rows, hidden] last-layer output → [rows, vocab] float32 logits (`head`: other LM-head
        rows, e.g. a reduced draft vocabulary)."""
        plan = self.gemm_plans["lm_head"] if head is None else None
        head = self.lm_head if head is None else head
        return linear(self._rms_norm(hidden, self.final_norm), head, None, plan).float()

    # -- forward -----------------------------------------------------------------------------
    @torch.inference_mode()
    def run(
        self,
        input_ids: list[int] | torch.Tensor | None = None,
        *,
        hidden: torch.Tensor | None = None,
        start_layer: int = 0,
        end_layer: int | None = None,
        logits: LogitRows = "all",
        tap_layers: tuple[int, ...] = (),
        position_ids: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        slot: int = 0,
    ) -> RunnerOutput:
        """Run layers [start_layer, end_layer) over n new positions.

        Layer 0 takes token ids; a later start layer takes `hidden` ([n, hidden_size], e.g. a tap
        from an earlier call). `tree_mask` ([n, n] bool, True = may attend) replaces the causal
        mask among the new tokens, or ([n, cached + n]) the mask over the whole cache;
        `position_ids` ([n]) replaces consecutive rotary positions.
        Logits are computed only when end_layer is the last layer, for the rows asked for.
        """
        end_layer = self.num_layers if end_layer is None else end_layer
        if start_layer == 0:
            ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device).reshape(-1)
            x = F.embedding(ids, self.embed)
        else:
            x = hidden.to(self.dtype)
        segment = self._segment(
            slot, 0, x.shape[0], start_layer, end_layer, position_ids, tree_mask
        )
        taps = {}
        for i in range(start_layer, end_layer):
            x = self._layer(i, x, [segment])
            if i + 1 in tap_layers:
                taps[i + 1] = x
        self._advance([segment], start_layer, end_layer)
        out_logits = None
        if end_layer == self.num_layers and logits != "none":
            out_logits = self.logits_from_hidden(x[-1:] if logits == "last" else x)
        return RunnerOutput(out_logits, x, taps)

    def _segment(
        self,
        slot: int,
        offset: int,
        n: int,
        start_layer: int,
        end_layer: int,
        position_ids: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
    ) -> _Segment:
        """Where n new tokens of `slot` go (rows offset..offset+n of the packed input), checked."""
        lengths = self.slot_lengths[slot]
        start = lengths[start_layer]
        if any(lengths[i] != start for i in range(start_layer, end_layer)):
            raise RuntimeError(
                f"layers {start_layer}..{end_layer - 1} hold different lengths: {lengths}"
            )
        if start + n > self.max_length:
            raise PromptError(
                f"sequence of {start + n} tokens exceeds the context of {self.max_length}; "
                "use a shorter prompt or fewer new tokens"
            )
        if position_ids is None:
            cos, sin = self.cos[start : start + n], self.sin[start : start + n]
        else:
            cos, sin = self.cos[position_ids], self.sin[position_ids]
        mask = self._mask(start, n, tree_mask)
        return _Segment(slot, start, slice(offset, offset + n), cos, sin, mask)

    def _advance(self, segments: list[_Segment], start_layer: int, end_layer: int) -> None:
        for seg in segments:
            lengths = self.slot_lengths[seg.slot]
            for i in range(start_layer, end_layer):
                lengths[i] = seg.start + seg.rows.stop - seg.rows.start

    def _mask(self, start: int, n: int, tree_mask: torch.Tensor | None) -> torch.Tensor | None:
        """Additive [n, start + n] mask (0 = attend, -inf = not), None for a lone causal token.
        `tree_mask` is [n, n] among the new tokens (every cached position visible), or
        [n, start + n] over the whole cache (a multi-level draft tree hides other branches)."""
        if n == 1 and tree_mask is None:
            return None
        local = tree_mask if tree_mask is not None else torch.ones(n, n, dtype=torch.bool).tril()
        local = local.to(torch.bool).cpu()
        if local.shape[1] == start + n:
            allowed = local
        else:
            allowed = torch.cat([torch.ones(n, start, dtype=torch.bool), local], dim=1)
        mask = torch.zeros(allowed.shape, dtype=self.dtype)
        return mask.masked_fill_(~allowed, float("-inf")).to(self.device)

    def forward(self, input_ids: list[int], logits: LogitRows = "all") -> torch.Tensor | None:
        return self.run(input_ids, logits=logits).logits

    def forward_batch(
        self,
        rows: list[list[int]],
        slots: list[int],
        logits: LogitRows = "all",
        head: torch.Tensor | None = None,
        trees: list[tuple[int, ...] | None] | None = None,
    ) -> list[torch.Tensor | None]:
        """Append rows[j] (any length, may be empty) to cache slot slots[j], all in one pass.

        Returns per row [rows, vocab] float32 logits ("all": every new token, "last": the last
        one, "none": None); `head` scores other LM-head rows (a reduced draft vocabulary).
        trees[j] (parent indices, `specpilot.tree`): row j is [root, node 0, node 1, ...] of a
        draft tree, fed with its tree mask and depth positions (see `keep_path`)."""
        outs = self.run_batch(rows, slots, logits=logits, head=head, trees=trees)
        return [out and out.logits for out in outs]

    def keep_path(self, slot: int, start: int, path: tuple[int, ...]) -> None:
        """After a tree fed from cache position `start` (its root): move the keys/values of the
        accepted nodes `path` (node i sits at start + 1 + i) to start + 1, start + 2, ..., where
        a chain would have put them. The caller then rolls back to the committed length."""
        if list(path) == list(range(len(path))):
            return  # the chain's own positions already
        source = torch.tensor([start + 1 + i for i in path], device=self.device)
        target = torch.arange(start + 1, start + 1 + len(path), device=self.device)
        for cache in (self.k_cache, self.v_cache):
            cache[:, slot, :, target] = cache[:, slot, :, source]

    @torch.inference_mode()
    def run_batch(
        self,
        rows: list[list[int]] | list[torch.Tensor],
        slots: list[int],
        *,
        start_layer: int = 0,
        end_layer: int | None = None,
        logits: LogitRows = "all",
        head: torch.Tensor | None = None,
        trees: list[tuple[int, ...] | None] | None = None,
        tap_layers: tuple[int, ...] = (),
    ) -> list[RunnerOutput | None]:
        """Run layers [start_layer, end_layer) over every row's new positions in one pass.

        Layer 0 takes token-id rows; a later start layer takes hidden-state rows ([n, hidden],
        e.g. what layer-split drafting already computed); trees as in `forward_batch`;
        `tap_layers`: also return the hidden states after these many layers. Per row:
        a RunnerOutput with that
        layer's hidden states and, when end_layer is the last layer, the logits asked for; None
        for an empty row."""
        if len(set(slots)) != len(slots) or not all(0 <= s < self.batch_size for s in slots):
            raise ValueError(f"slots must be distinct and in 0..{self.batch_size - 1}: {slots}")
        end_layer = self.num_layers if end_layer is None else end_layer
        live = [j for j, row in enumerate(rows) if len(row)]
        out: list[RunnerOutput | None] = [None] * len(rows)
        if not live:
            return out
        segments, offset = [], 0
        for j in live:
            n = len(rows[j])
            tree = None if trees is None else trees[j]
            if tree is None:
                segments.append(self._segment(slots[j], offset, n, start_layer, end_layer))
            else:
                start = self.slot_lengths[slots[j]][start_layer]
                positions = torch.tensor(
                    [start] + [start + d for d in tree_depths(tree)], device=self.device
                )
                segments.append(
                    self._segment(
                        slots[j], offset, n, start_layer, end_layer, positions, tree_mask(tree)
                    )
                )
            offset += n
        if start_layer == 0:
            ids = torch.tensor([t for j in live for t in rows[j]], dtype=torch.long)
            x = F.embedding(ids.to(self.device), self.embed)
        else:
            x = torch.cat([rows[j] for j in live]).to(self.dtype)
        taps = {}
        for i in range(start_layer, end_layer):
            x = self._layer(i, x, segments)
            if i + 1 in tap_layers:
                taps[i + 1] = x
        self._advance(segments, start_layer, end_layer)
        picks = [
            seg.rows if logits == "all" else slice(seg.rows.stop - 1, seg.rows.stop)
            for seg in segments
        ]
        scored = None
        if end_layer == self.num_layers and logits != "none":
            scored = self.logits_from_hidden(torch.cat([x[p] for p in picks]), head)
        offset = 0
        for j, seg, p in zip(live, segments, picks, strict=True):
            n = p.stop - p.start
            row_logits = None if scored is None else scored[offset : offset + n]
            row_taps = {k: tap[seg.rows] for k, tap in taps.items()}
            out[j] = RunnerOutput(row_logits, x[seg.rows], row_taps)
            offset += n
        return out
