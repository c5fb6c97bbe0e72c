"""What the feature drafter learns from, per training sequence: the target's taps and logits.

One teacher-forced prefill of the target per sequence gives, at every position, the hidden
states at the head's feature layers (its input) and the target's logits over the draft
vocabulary (its soft labels). By default they are recomputed each time: for the 1.5B target a
position's taps and final hidden state take 12 KB in bf16 (1.2 GB per 100k tokens). With a
`FeatureCache` (feature_cache.py) each sequence is prefilled once, which pays where the prefill
is a large share of an update (float32 CPUs; README, train-eagle).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specpilot.errors import ConfigError
from specpilot.training.eagle.data import Sample
from specpilot.training.eagle.feature_cache import FeatureCache


def require_cpu_target(runner) -> None:
    """The feature head trains on the CPU beside a CPU target (train-eagle, train-ppow and its
    distillation baseline): its features, rollouts and optimiser state are built there (this
    project's machines have no GPU), so a target on another device is refused up front rather
    than failing mid-run on mixed devices."""
    if runner.device.type != "cpu":
        raise ConfigError(
            "the eagle head trains on the CPU: load the target with device='cpu' "
            f"(it is on {runner.device})"
        )


@dataclass
class SequenceFeatures:
    taps: torch.Tensor
    """[n, layers · h] target taps at positions 0..n-1 (n = tokens − 1)."""
    embeds: torch.Tensor
    """[n, h] target embeddings of tokens 1..n (the next token of each position)."""
    target_logits: torch.Tensor | None
    """[n, draft vocab] the target's logits at positions 1..n (what position t must predict);
    None where the caller needs no soft labels (PPOW's rollouts, judged by the target itself)."""
    loss_mask: torch.Tensor
    """[n] bool: positions whose prediction is a response token."""
    cos: torch.Tensor
    sin: torch.Tensor


@torch.no_grad()
def sequence_features(
    runner,
    sample: Sample,
    feature_layers: tuple[int, ...],
    draft_head_rows: torch.Tensor,
    keep_cache: bool = False,
    cache: FeatureCache | None = None,
    length: int | None = None,
    with_logits: bool = True,
) -> SequenceFeatures:
    """Teacher-forced target prefill of one sample (cache slot 0, reset first), or its taps and
    hidden states from `cache` (stored there on first use). `length`: only the sample's first
    `length` tokens (a prefix of it). `keep_cache`: leave those tokens in the KV cache, for
    forwards that continue from them; with a `cache` and a runner that exports its KV cache, the
    whole sample's keys and values are stored on first use and later loaded and cut there.
    `with_logits=False` skips the soft labels (a product with the LM head at every position)."""
    ids = sample.token_ids
    length = len(ids) if length is None else length
    n = length - 1
    with torch.inference_mode():  # the runner's tensors; cloned below into autograd-safe ones
        taps, hidden = _target_states(runner, ids, length, feature_layers, keep_cache, cache)
        target_logits = runner.logits_from_hidden(hidden, draft_head_rows) if with_logits else None
        embeds = F.embedding(torch.tensor(ids[1:length]), runner.embed).float()
        taps = taps.float()
    # Position t predicts token t + 2: score it when that token is part of the response.
    positions = torch.arange(n)
    loss_mask = (positions >= len(sample.prompt_ids) - 2) & (positions < n - 1)
    return SequenceFeatures(
        taps.clone(),
        embeds.clone(),
        None if target_logits is None else target_logits.clone(),
        loss_mask,
        runner.cos[:n].float().clone(),
        runner.sin[:n].float().clone(),
    )


def _target_states(
    runner, ids, length, layers, keep_cache, cache
) -> tuple[torch.Tensor, torch.Tensor]:
    """Taps and last hidden states at positions 0..length − 2 of `ids`: prefilled, or read from
    `cache` (`keep_cache` also needs the stored KV cache, where the runner can load one)."""
    if cache is None or (keep_cache and not hasattr(runner, "load_cache_state")):
        # Without a stored KV cache to load, the prefix's own prefill is the one it needs.
        return _prefill(runner, ids[:length], layers, keep_cache)
    stored = cache.load(ids)
    state = cache.load_kv(ids) if keep_cache else None
    if stored is None or (keep_cache and state is None):
        prefilled = _prefill(runner, ids, layers, keep_cache)
        if stored is None:
            stored = prefilled
            cache.store(ids, *stored)
        if keep_cache:
            cache.store_kv(ids, *runner.cache_state(0, len(ids)))
    elif keep_cache:
        runner.reset()
        runner.load_cache_state(0, *state)
    if keep_cache:
        runner.rollback(length)
    taps, hidden = stored
    return taps[: length - 1], hidden[: length - 1]


def _prefill(runner, ids, layers, keep_cache) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(ids) - 1
    runner.reset()
    out = runner.run(ids, tap_layers=layers, logits="none")
    taps = torch.cat([out.taps[k][:n] for k in layers], dim=-1)
    if not keep_cache:
        runner.reset()
    return taps, out.hidden[1:]
