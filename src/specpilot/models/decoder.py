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
Its float32 logits match transformers' for the same weights (tests/unit/test_decoder.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specpilot.errors import PromptError
from specpilot.models.runner import LogitRows, RunnerOutput

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x: [n, in] → [n, out]. On CPU, oneDNN's bf16 `F.linear` streams weights slowly; measured
    here, `torch.mv` (one row) and `weight @ x.T` (several rows) are 1.4-1.6x faster for 1-256
    rows, which is what makes verifying k tokens cost about as much as decoding one."""
    if x.device.type != "cpu":
        return F.linear(x, weight, bias)
    out = torch.mv(weight, x[0])[None] if x.shape[0] == 1 else torch.mm(weight, x.t()).t()
    return out if bias is None else out + bias


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

    def __init__(self, hf_model, max_length: int | None = None):
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
        rotary = inner.rotary_emb
        positions = torch.arange(self.max_length, device=self.device, dtype=torch.float32)
        freqs = torch.outer(positions, rotary.inv_freq.float().to(self.device))
        angles = torch.cat([freqs, freqs], dim=-1)
        scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.cos = (angles.cos() * scale).to(self.dtype)  # [max_length, head_dim]
        self.sin = (angles.sin() * scale).to(self.dtype)
        shape = (self.num_layers, self.num_kv_heads, self.max_length, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.lengths = [0] * self.num_layers

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
    def length(self) -> int:
        return self.lengths[-1]

    def rollback(self, length: int, layers: range | None = None) -> None:
        for i in layers if layers is not None else range(self.num_layers):
            self.lengths[i] = min(self.lengths[i], length)

    def reset(self) -> None:
        self.lengths = [0] * self.num_layers

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

    def _attention(self, i: int, layer: _Layer, x, start: int, cos, sin, mask) -> torch.Tensor:
        n = x.shape[0]
        qkv = _linear(x, layer.qkv, layer.qkv_bias)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q = qkv[:, :q_size].view(n, self.num_heads, self.head_dim).transpose(0, 1)
        k = (
            qkv[:, q_size : q_size + kv_size]
            .view(n, self.num_kv_heads, self.head_dim)
            .transpose(0, 1)
        )
        v = qkv[:, q_size + kv_size :].view(n, self.num_kv_heads, self.head_dim).transpose(0, 1)
        q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        end = start + n
        self.k_cache[i, :, start:end] = k
        self.v_cache[i, :, start:end] = v
        # Fold each GQA group into the query axis ([kv_heads, group * n, head_dim]) so attention
        # reads the cache once per kv head, without expanding keys/values per query head.
        group = self.num_heads // self.num_kv_heads
        grouped_q = q.reshape(self.num_kv_heads, group * n, self.head_dim)
        out = F.scaled_dot_product_attention(
            grouped_q[None],
            self.k_cache[i, :, :end][None],
            self.v_cache[i, :, :end][None],
            attn_mask=None if mask is None else mask.repeat(group, 1),
        )  # [1, kv_heads, group * n, head_dim]
        out = out[0].reshape(self.num_heads, n, self.head_dim).transpose(0, 1).reshape(n, q_size)
        return _linear(out, layer.o, layer.o_bias)

    def _layer(self, i: int, x, start: int, cos, sin, mask) -> torch.Tensor:
        layer = self.layers[i]
        x = x + self._attention(
            i, layer, self._rms_norm(x, layer.input_norm), start, cos, sin, mask
        )
        gate, up = _linear(self._rms_norm(x, layer.post_norm), layer.gate_up, None).chunk(2, dim=-1)
        return x + _linear(F.silu(gate) * up, layer.down, None)

    def logits_from_hidden(
        self, hidden: torch.Tensor, head: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[rows, hidden] last-layer output → [rows, vocab] float32 logits (`head`: other LM-head
        rows, e.g. a reduced draft vocabulary)."""
        head = self.lm_head if head is None else head
        return _linear(self._rms_norm(hidden, self.final_norm), head, None).float()

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
    ) -> RunnerOutput:
        """Run layers [start_layer, end_layer) over n new positions.

        Layer 0 takes token ids; a later start layer takes `hidden` ([n, hidden_size], e.g. a tap
        from an earlier call). `tree_mask` ([n, n] bool, True = may attend) replaces the causal
        mask among the new tokens; `position_ids` ([n]) replaces consecutive rotary positions.
        Logits are computed only when end_layer is the last layer, for the rows asked for.
        """
        end_layer = self.num_layers if end_layer is None else end_layer
        if start_layer == 0:
            ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device).reshape(-1)
            x = F.embedding(ids, self.embed)
        else:
            x = hidden.to(self.dtype)
        n = x.shape[0]
        start = self.lengths[start_layer]
        if any(self.lengths[i] != start for i in range(start_layer, end_layer)):
            raise RuntimeError(
                f"layers {start_layer}..{end_layer - 1} hold different lengths: {self.lengths}"
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
        taps = {}
        for i in range(start_layer, end_layer):
            x = self._layer(i, x, start, cos, sin, mask)
            self.lengths[i] = start + n
            if i + 1 in tap_layers:
                taps[i + 1] = x
        out_logits = None
        if end_layer == self.num_layers and logits != "none":
            out_logits = self.logits_from_hidden(x[-1:] if logits == "last" else x)
        return RunnerOutput(out_logits, x, taps)

    def _mask(self, start: int, n: int, tree_mask: torch.Tensor | None) -> torch.Tensor | None:
        """Additive [n, start + n] mask (0 = attend, -inf = not), None for a lone causal token."""
        if n == 1 and tree_mask is None:
            return None
        local = tree_mask if tree_mask is not None else torch.ones(n, n, dtype=torch.bool).tril()
        allowed = torch.cat(
            [torch.ones(n, start, dtype=torch.bool), local.to(torch.bool).cpu()], dim=1
        )
        mask = torch.zeros(allowed.shape, dtype=self.dtype)
        return mask.masked_fill_(~allowed, float("-inf")).to(self.device)

    def forward(self, input_ids: list[int], logits: LogitRows = "all") -> torch.Tensor | None:
        return self.run(input_ids, logits=logits).logits
