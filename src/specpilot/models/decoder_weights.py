"""The lean decoder's weights: which architectures it reproduces, and each layer's weights fused
(qkv in one matrix, gate+up in one) so a step streams them in fewer, larger products."""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


@dataclass
class DecoderLayer:
    """One decoder layer's weights, detached from the transformers module and fused."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def supports(config) -> bool:
    """True when the lean decoder reproduces the architecture exactly."""
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(config, "mlp_bias", False):
        return False
    window = getattr(config, "sliding_window", None)
    return not (getattr(config, "use_sliding_window", window is not None) and window)


def fuse_layer(layer) -> DecoderLayer:
    """A transformers Llama/Qwen2 decoder layer's weights, with qkv and gate+up fused."""
    attn, mlp = layer.self_attn, layer.mlp
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    has_bias = attn.q_proj.bias is not None
    return DecoderLayer(
        input_norm=layer.input_layernorm.weight.detach(),
        qkv=torch.cat([p.weight.detach() for p in projections]),
        qkv_bias=torch.cat([p.bias.detach() for p in projections]) if has_bias else None,
        o=attn.o_proj.weight.detach(),
        o_bias=None if attn.o_proj.bias is None else attn.o_proj.bias.detach(),
        post_norm=layer.post_attention_layernorm.weight.detach(),
        gate_up=torch.cat([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()]),
        down=mlp.down_proj.weight.detach(),
    )


def rotary_tables(rotary, max_length: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ([max_length, head_dim]) of every position, from the model's rotary module
    (its inverse frequencies and attention scaling), in the runner's dtype."""
    positions = torch.arange(max_length, device=device, dtype=torch.float32)
    freqs = torch.outer(positions, rotary.inv_freq.float().to(device))
    angles = torch.cat([freqs, freqs], dim=-1)
    scale = float(getattr(rotary, "attention_scaling", 1.0))
    return (angles.cos() * scale).to(dtype), (angles.sin() * scale).to(dtype)
