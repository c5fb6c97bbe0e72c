"""The lean decoder's attention math: RMS norm, rotary embedding, additive masks, and one row's
new tokens attending to its own cache slot (ragged batches run attention row by row)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Segment:
    """One row of a packed forward: its cache slot, first position, rows in the packed input,
    rotary tables and additive attention mask (None for a lone causal token)."""

    slot: int
    start: int
    rows: slice
    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor | None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def additive_mask(
    start: int, n: int, tree_mask: torch.Tensor | None, dtype, device
) -> torch.Tensor | None:
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
    mask = torch.zeros(allowed.shape, dtype=dtype)
    return mask.masked_fill_(~allowed, float("-inf")).to(device)


def segment_attention(
    qkv: torch.Tensor,
    seg: Segment,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """One row's new tokens attend to its own slot (`k_cache`, `v_cache`: that layer's and slot's
    [kv heads, positions, head dim]): write its keys/values, then attend. Returns [n, q size]."""
    n = qkv.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q = qkv[:, :q_size].view(n, num_heads, head_dim).transpose(0, 1)
    k = qkv[:, q_size : q_size + kv_size].view(n, num_kv_heads, head_dim).transpose(0, 1)
    v = qkv[:, q_size + kv_size :].view(n, num_kv_heads, head_dim).transpose(0, 1)
    q, k = rope(q, seg.cos, seg.sin), rope(k, seg.cos, seg.sin)
    end = seg.start + n
    k_cache[:, seg.start : end] = k
    v_cache[:, seg.start : end] = v
    # Fold each GQA group into the query axis ([kv_heads, group * n, head_dim]) so attention
    # reads the cache once per kv head, without expanding keys/values per query head.
    group = num_heads // num_kv_heads
    grouped_q = q.reshape(num_kv_heads, group * n, head_dim)
    out = F.scaled_dot_product_attention(
        grouped_q[None],
        k_cache[:, :end][None],
        v_cache[:, :end][None],
        attn_mask=None if seg.mask is None else seg.mask.repeat(group, 1),
    )  # [1, kv_heads, group * n, head_dim]
    return out[0].reshape(num_heads, n, head_dim).transpose(0, 1).reshape(n, q_size)
