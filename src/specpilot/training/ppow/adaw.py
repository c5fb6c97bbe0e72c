"""Adaptive Divergence-Aware Windowing (PPOW §4.2, App. B): train more on the windows where the
drafter diverges from a confident target.

Token criticality v_t = C(P_t)·KL(P_t‖Q_t) with confidence C(P) = 1 − H(P)/log|V|, from one
teacher-forced pass of the target and the head (depth 1) per sequence; a window's criticality is
the mean over its K positions (`adaw_sequences` caps the sequences scored per refresh: a
random subset, for large targets). The hard pool is the top `adaw_pool` fraction of windows; each
batch draws a curriculum fraction from it (0.2 → 0.4 → 0.6 over equal stages after
`adaw_start`) and the rest uniformly. Scores are recomputed with the current head every
`adaw_refresh` updates. P and Q are both over the draft vocabulary (the head's own; the target's
renormalised on it), so |V| is the draft vocabulary's size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tqdm import tqdm

from specpilot.models.loading import cpu_autocast
from specpilot.training.ppow.config import PpowConfig


def token_criticality(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """[n, V] logits of the target and the drafter → [n] C(P)·KL(P‖Q)."""
    target_logp = F.log_softmax(target_logits.float(), dim=-1)
    draft_logp = F.log_softmax(draft_logits.float(), dim=-1)
    p = target_logp.exp()
    entropy = -(p * target_logp).sum(-1)
    confidence = 1 - entropy / math.log(target_logits.shape[-1])
    return confidence * (p * (target_logp - draft_logp)).sum(-1)


def window_criticality(
    token_scores: torch.Tensor, lengths: torch.Tensor, window: int
) -> torch.Tensor:
    """Mean criticality of each window (prefix length L: its tokens L..L+K−1 are drafted at head
    positions L−2..L+K−3)."""
    padded = torch.cat([torch.zeros(1), token_scores.double().cumsum(0)])
    start = lengths - 2
    return ((padded[start + window] - padded[start]) / window).float()


@torch.no_grad()
def score_windows(
    head,
    samples,
    candidates: tuple[torch.Tensor, torch.Tensor],
    features,
    window: int,
    bf16: bool | None,
    progress: bool,
    sequences: list[int] | None = None,
) -> torch.Tensor:
    """Criticality of every candidate window (`features(sample)` → SequenceFeatures); only the
    windows of `sequences` (sample indices; None: all) are scored, the others get −inf."""
    indices, lengths = candidates
    scores = torch.full((indices.numel(),), float("-inf"))
    head.eval()
    todo = indices.unique().tolist() if sequences is None else sequences
    for i in tqdm(todo, disable=not progress, desc="ADAW scores", leave=False):
        feats = features(samples[i])
        with cpu_autocast(bf16):
            out, _, _ = head.block(head.fuse(feats.taps), feats.embeds, feats.cos, feats.sin)
            draft_logits = head.logits(out)
        tokens = token_criticality(feats.target_logits, draft_logits)
        mine = indices == i
        scores[mine] = window_criticality(tokens, lengths[mine], window)
    head.train()
    return scores


def hard_pool(scores: torch.Tensor, fraction: float) -> torch.Tensor:
    """Indices of the top `fraction` of the scored windows by criticality (at least one)."""
    count = max(1, math.ceil(fraction * int(torch.isfinite(scores).sum())))
    return torch.topk(scores, count).indices


def hard_fraction(update: int, config: PpowConfig) -> float:
    """The curriculum's share of hard windows at (0-based) `update`: 0 before ADAW starts (or
    without ADAW), then each curriculum value for an equal share of the remaining updates."""
    if not config.adaw or update < config.adaw_start:
        return 0.0
    stages = config.adaw_curriculum
    span = max(1, config.updates - config.adaw_start)
    return stages[min(len(stages) - 1, (update - config.adaw_start) * len(stages) // span)]


def refresh_due(update: int, config: PpowConfig) -> bool:
    """Whether the window scores are recomputed before (0-based) `update`."""
    since = update - config.adaw_start
    return config.adaw and since >= 0 and since % config.adaw_refresh == 0


def select_windows(
    count: int,
    candidates: int,
    pool: torch.Tensor | None,
    fraction: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """`count` candidate indices: round(fraction·count) drawn from the hard pool, the rest
    uniformly from all candidates (each part without replacement where it can)."""
    hard = 0 if pool is None else round(fraction * count)
    chosen = []
    if hard:
        chosen.append(pool[_draw(pool.numel(), hard, generator)])
    chosen.append(_draw(candidates, count - hard, generator))
    return torch.cat(chosen)


def _draw(size: int, count: int, generator: torch.Generator) -> torch.Tensor:
    if count <= size:
        return torch.randperm(size, generator=generator)[:count]
    return torch.randint(size, (count,), generator=generator)
