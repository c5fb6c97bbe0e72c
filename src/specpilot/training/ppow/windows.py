"""Speculative windows: candidates, the drafter's rollouts and the target's verdict on them.

A window is a prefix of a training sequence (its first L tokens, L >= the prompt) and the K
tokens after it. The drafter drafts it in its own unrolled regime, exactly as `EagleDrafter`
drafts a chain: the root is the head's step-1 output at position L − 2 (target feature of x_{L−2},
embedding of x_{L−1}); each later step feeds the head its own previous output with the embedding
of the token just drafted, attending to the prefix's step-1 keys and its own earlier window keys
(EAGLE-3's training-time test). All windows of a sequence and the G rows of each group run
together: one block call per window position.

The target judges every window of a sequence in one forward from its teacher-forced cache: per
window a root (x_{L−1} again, whose output is P_1) and G chains y_1..y_{K−1} (plus, for the
proximity reward, the reference chain ŷ), under a mask that shows each node its prefix, its root
and its own chain only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specpilot.drafting.eagle_head import EagleHead
from specpilot.errors import ConfigError
from specpilot.training.eagle.data import Sample
from specpilot.training.eagle.features import SequenceFeatures


def candidate_windows(samples: list[Sample], window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sample index, prefix length L) of every window of K response tokens: L runs from the
    prompt's length to len(tokens) − K (and L >= 2, the head needs one feature)."""
    indices, lengths = [], []
    for i, sample in enumerate(samples):
        first = max(len(sample.prompt_ids), 2)
        last = len(sample.token_ids) - window
        if last >= first:
            lengths.append(torch.arange(first, last + 1))
            indices.append(torch.full((last - first + 1,), i))
    if not indices:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    return torch.cat(indices), torch.cat(lengths)


@dataclass
class HeadPrefix:
    out: torch.Tensor
    """[n, h] step-1 outputs (position t drafts token t + 2)."""
    k: torch.Tensor
    v: torch.Tensor


def head_prefix(head: EagleHead, feats: SequenceFeatures) -> HeadPrefix:
    """The head's causal step-1 pass over a whole sequence (its keys serve every window)."""
    out, k, v = head.block(head.fuse(feats.taps), feats.embeds, feats.cos, feats.sin)
    return HeadPrefix(out, k, v)


def unroll_windows(
    head: EagleHead,
    prefix: HeadPrefix,
    feats: SequenceFeatures,
    embed: torch.Tensor,
    lengths: list[int],
    group: int,
    window: int,
    temperature: float = 1.0,
    tokens: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft (or, given `tokens`, re-score) G windows after each prefix length in `lengths`.

    Returns the drafter's log-probabilities at temperature `temperature` [W·G, K, V] (float32,
    with grad when the head has it) and the draft-vocabulary tokens [W·G, K] (sampled from them
    with `generator` when `tokens` is None). Rows are window-major: row w·G + g."""
    roots = torch.tensor(lengths).repeat_interleave(group) - 2
    rows = roots.numel()
    positions = torch.arange(prefix.k.shape[1])
    prefix_mask = positions[None, :] <= roots[:, None]
    own = torch.eye(rows, dtype=torch.bool)
    hidden = prefix.out[roots]
    keys, values = [prefix.k], [prefix.v]
    logps, chosen = [], []
    for j in range(window):
        if j > 0:
            ids = head.draft_ids[chosen[-1]]
            allowed = torch.cat([prefix_mask, own.repeat(1, j)], dim=1)
            mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
            at = roots + j
            hidden, k, v = head.block(
                hidden,
                F.embedding(ids, embed).to(hidden.dtype),
                feats.cos[at],
                feats.sin[at],
                torch.cat(keys, dim=1),
                torch.cat(values, dim=1),
                mask.to(hidden.dtype),
            )
            keys.append(k)
            values.append(v)
        logp = F.log_softmax(head.logits(hidden).float() / temperature, dim=-1)
        if tokens is None:
            pick = torch.multinomial(logp.detach().exp(), 1, generator=generator)[:, 0]
        else:
            pick = tokens[:, j]
        logps.append(logp)
        chosen.append(pick)
    return torch.stack(logps, dim=1), torch.stack(chosen, dim=1)


@dataclass
class TargetVerdict:
    """The target's view of drafted windows ([W, G, ...]) and of each window's reference ŷ."""

    logp: torch.Tensor
    """[W, G, K] log P_j(y_j) over the full vocabulary (at the rollout temperature)."""
    best: torch.Tensor
    """[W, G, K] bool: y_j is the target's argmax."""
    draft_logp: torch.Tensor
    """[W, G, K, V] the target's log-distribution restricted to the draft vocabulary."""
    reference_logp: torch.Tensor
    """[W] L(ŷ): the summed target log-probabilities of the reference window."""


@torch.no_grad()
def judge_windows(
    runner,
    ids: list[int],
    lengths: list[int],
    drafted: torch.Tensor,
    draft_ids: torch.Tensor,
    temperature: float,
    reference: str,
) -> TargetVerdict:
    """Score windows drafted after each prefix length (`drafted` [W, G, K] full target ids)
    against the target, whose cache slot 0 holds `ids` (a `keep_cache` prefill). Windows go in
    as few forwards as the cache has room for; the cache is reset at the end."""
    w_count, group, window = drafted.shape
    chains = group + (1 if reference == "response" else 0)
    per_window = 1 + chains * (window - 1)
    room = runner.max_length - len(ids)
    if per_window > room:
        raise ConfigError(
            f"the target's cache has room for {room} window tokens past the sequence, a group "
            f"needs {per_window}: load the target with a larger max_length",
            options=("max_length",),
        )
    step = room // per_window
    parts = [
        _judge_chunk(runner, ids, lengths[s : s + step], drafted[s : s + step], chains)
        for s in range(0, w_count, step)
    ]
    full = torch.cat(parts) / temperature  # [W, chains, K, vocab] logits at positions 1..K
    logp_full = F.log_softmax(full, dim=-1)
    drafted_logp = logp_full[:, :group].gather(-1, drafted[..., None]).squeeze(-1)
    best = full[:, :group].argmax(-1) == drafted
    draft_logp = F.log_softmax(full[:, :group][..., draft_ids], dim=-1)
    if reference == "response":
        truth = torch.stack([torch.tensor(ids[n : n + window]) for n in lengths])
        reference_logp = logp_full[:, group].gather(-1, truth[..., None]).squeeze(-1).sum(-1)
    else:
        reference_logp = _greedy_reference(runner, ids, lengths, window, temperature)
    runner.reset()
    return TargetVerdict(drafted_logp, best, draft_logp, reference_logp)


def _judge_chunk(runner, ids, lengths, drafted, chains) -> torch.Tensor:
    """One target forward over some windows; returns their logits [w, chains, K, vocab]."""
    cached = len(ids)
    w_count, group, window = drafted.shape
    tokens, positions, owners, parents = [], [], [], []
    for w, length in enumerate(lengths):
        root = len(tokens)
        tokens.append(ids[length - 1])
        positions.append(length - 1)
        owners.append(length - 1)
        parents.append(-1)
        for c in range(chains):
            chain = drafted[w, c].tolist() if c < group else ids[length : length + window]
            previous = root
            for j, token in enumerate(chain[: window - 1]):
                tokens.append(token)
                positions.append(length + j)
                owners.append(length - 1)
                parents.append(previous)
                previous = len(tokens) - 1
    m = len(tokens)
    allowed = torch.zeros(m, cached + m, dtype=torch.bool)
    for i in range(m):
        allowed[i, : owners[i]] = True
        node = i
        while node >= 0:
            allowed[i, cached + node] = True
            node = parents[node]
    out = runner.run(tokens, tree_mask=allowed, position_ids=torch.tensor(positions), logits="all")
    runner.rollback(cached)
    logits = out.logits.float().clone()
    rows = []
    for w in range(w_count):
        base = w * (1 + chains * (window - 1))
        chain_rows = [
            torch.cat(
                [logits[base : base + 1], logits[base + 1 + c * (window - 1) :][: window - 1]]
            )
            for c in range(chains)
        ]
        rows.append(torch.stack(chain_rows))
    return torch.stack(rows)


def _greedy_reference(runner, ids, lengths, window, temperature) -> torch.Tensor:
    """L(ŷ) for ŷ = K greedy target steps from each prefix (K one-token forwards each). Longest
    prefix first: each run overwrites the cache past its own prefix only."""
    totals = {}
    for length in sorted(set(lengths), reverse=True):
        runner.rollback(length - 1)
        token, total = ids[length - 1], 0.0
        for _ in range(window):
            logits = runner.run([token], logits="last").logits[-1].float() / temperature
            logp = F.log_softmax(logits, dim=-1)
            token = int(logp.argmax())
            total += float(logp[token])
        totals[length] = total
    return torch.tensor([totals[n] for n in lengths])
