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
The fused weights live in `decoder_weights`, the attention math in `decoder_attention` and the
KV cache (slots, rollback, export) in `decoder_cache`; this module runs the layers.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from specpilot.errors import PromptError
from specpilot.models.decoder_attention import Segment, additive_mask, rms_norm, segment_attention
from specpilot.models.decoder_cache import DecoderCache
from specpilot.models.decoder_weights import DecoderLayer, fuse_layer, rotary_tables, supports
from specpilot.models.gemm import GemmPlan, linear, plan_for
from specpilot.models.runner import LogitRows, RunnerOutput
from specpilot.tree import tree_depths, tree_mask

__all__ = ["LM_HEAD_PLAN_ROWS", "DecoderRunner", "supports"]

LM_HEAD_PLAN_ROWS = 16
"""Rows the LM head's plan covers: a step scores its verified rows only (1 for a plain step, a
chain or tree of ≤ 16), and timing the largest weight for 48 row counts took 70 s in float32."""


class DecoderRunner(DecoderCache):
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
        self.layers = [fuse_layer(layer) for layer in inner.layers]
        self.gemm_plans: dict[str, GemmPlan | None] = {
            name: plan_for(getattr(self.layers[0], name)) if self.layers else None
            for name in ("gate_up", "down")
        }
        self.gemm_plans["lm_head"] = plan_for(self.lm_head, LM_HEAD_PLAN_ROWS)
        """How this CPU multiplies the MLP's weights and the LM head (most of a step's weight
        bytes) by a few rows fastest (models.gemm), one plan per product: the best layout
        differs by shape."""
        self.cos, self.sin = rotary_tables(
            inner.rotary_emb, self.max_length, self.device, self.dtype
        )  # [max_length, head_dim] each
        self._allocate_cache(batch_size)

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

    @property
    def streamed_bytes(self) -> int:
        """Bytes of weights one decode step must read (all layers, final norm, LM head; the
        embedding contributes one row): weight bytes ÷ memory bandwidth is the roofline time."""
        tensors = [self.final_norm, self.lm_head]
        for layer in self.layers:
            tensors += [t for t in vars(layer).values() if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    # -- layers ------------------------------------------------------------------------------
    def _attention(self, i: int, layer: DecoderLayer, x, segments: list[Segment]) -> torch.Tensor:
        qkv = linear(x, layer.qkv, layer.qkv_bias)
        outs = [
            segment_attention(
                qkv[seg.rows],
                seg,
                self.k_cache[i, seg.slot],
                self.v_cache[i, seg.slot],
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
            )
            for seg in segments
        ]
        attended = outs[0] if len(outs) == 1 else torch.cat(outs)
        return linear(attended, layer.o, layer.o_bias)

    def _layer(self, i: int, x, segments: list[Segment]) -> torch.Tensor:
        layer = self.layers[i]
        x = x + self._attention(i, layer, rms_norm(x, layer.input_norm, self.eps), segments)
        normed = rms_norm(x, layer.post_norm, self.eps)
        gate, up = linear(normed, layer.gate_up, None, self.gemm_plans["gate_up"]).chunk(2, dim=-1)
        return x + linear(F.silu(gate) * up, layer.down, None, self.gemm_plans["down"])

    def logits_from_hidden(
        self, hidden: torch.Tensor, head: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[rows, hidden] last-layer output → [rows, vocab] float32 logits (`head`: other LM-head
        rows, e.g. a reduced draft vocabulary)."""
        plan = self.gemm_plans["lm_head"] if head is None else None
        head = self.lm_head if head is None else head
        return linear(rms_norm(hidden, self.final_norm, self.eps), head, None, plan).float()

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
    ) -> Segment:
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
        mask = additive_mask(start, n, tree_mask, self.dtype, self.device)
        return Segment(slot, start, slice(offset, offset + n), cos, sin, mask)

    def _advance(self, segments: list[Segment], start_layer: int, end_layer: int) -> None:
        for seg in segments:
            lengths = self.slot_lengths[seg.slot]
            for i in range(start_layer, end_layer):
                lengths[i] = seg.start + seg.rows.stop - seg.rows.start

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
