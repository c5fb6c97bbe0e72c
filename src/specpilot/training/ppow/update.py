"""One PPOW update: G sampled windows after each chosen prefix (the rollouts), the target's
verdict on them, rewards and group advantages, then `ppo_epochs` gradient steps on the clipped
surrogate + β·KL."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.models.loading import cpu_autocast
from specpilot.training.eagle.features import SequenceFeatures
from specpilot.training.ppow.loss import ppow_loss
from specpilot.training.ppow.rewards import (
    accepted_length,
    group_advantages,
    proximity_reward,
    speed_reward,
)
from specpilot.training.ppow.windows import head_prefix, judge_windows, unroll_windows


def ppow_update(
    head, optimizer, train, candidates, chosen, features, runner, config, gamma, generator
) -> dict:
    """Rollouts, rewards and `ppo_epochs` gradient steps on the chosen windows; the logged
    means."""
    indices, lengths = candidates
    by_sample: dict[int, list[int]] = {}
    for c in chosen.tolist():
        by_sample.setdefault(int(indices[c]), []).append(int(lengths[c]))
    batches = [
        _rollout(head, train[i], prefix_lengths, features, runner, config, gamma, generator)
        for i, prefix_lengths in by_sample.items()
    ]
    windows = sum(b.tokens.shape[0] for b in batches)
    kls, clips, losses = [], [], []
    for _ in range(config.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        for batch in batches:
            with cpu_autocast(config.bf16):
                prefix = head_prefix(head, batch.feats)
                logp, _ = unroll_windows(
                    head, prefix, batch.feats, runner.embed, batch.lengths, config.group,
                    config.window, config.temperature, tokens=batch.tokens,
                )  # fmt: skip
            parts = ppow_loss(
                logp, batch.tokens, batch.old_logp, batch.advantages, batch.target_logp,
                config.clip_eps, config.kl_beta, config.kl_direction,
            )  # fmt: skip
            share = batch.tokens.shape[0] / windows
            (parts.loss * share).backward()
            kls.append(parts.kl * share)
            clips.append(parts.clip_fraction * share)
            losses.append(float(parts.loss.detach()) * share)
        torch.nn.utils.clip_grad_norm_(head.parameters(), config.clip_grad)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    epochs = config.ppo_epochs
    return {
        "reward": float(torch.cat([b.reward for b in batches]).mean()),
        "accepted": float(torch.cat([b.accepted for b in batches]).mean()),
        "prox_rate": float((torch.cat([b.prox for b in batches]) > 0).float().mean()),
        "kl": sum(kls) / epochs,
        "clip_frac": sum(clips) / epochs,
        "loss": sum(losses) / epochs,
    }


@dataclass
class Rollouts:
    """One sequence's groups: what the gradient steps re-score, and what the log reports.
    Window rows are window-major (row w·G + g)."""

    feats: SequenceFeatures
    lengths: list[int]
    tokens: torch.Tensor
    """[W·G, K] drafted draft-vocabulary ids."""
    old_logp: torch.Tensor
    """[W·G, K] their log-probability under the sampling policy."""
    advantages: torch.Tensor
    """[W·G]"""
    target_logp: torch.Tensor
    """[W·G, K, V] the target's log-distribution over the draft vocabulary."""
    reward: torch.Tensor
    accepted: torch.Tensor
    prox: torch.Tensor


def _rollout(head, sample, lengths, features, runner, config, gamma, generator) -> Rollouts:
    """G windows after each prefix length of one sample, with the target's verdict, rewards and
    advantages: everything the gradient steps need. The sample is cut after its last window
    (nothing later is seen by the head or the target), which halves the prefill on average."""
    end = max(lengths) + config.window
    feats = features(sample, keep_cache=True, length=end, with_logits=False)
    ids = sample.token_ids[:end]
    g, k = config.group, config.window
    with torch.no_grad(), cpu_autocast(config.bf16):
        prefix = head_prefix(head, feats)
        logp, tokens = unroll_windows(
            head, prefix, feats, runner.embed, lengths, g, k, config.temperature,
            generator=generator,
        )  # fmt: skip
    old_logp = logp.gather(-1, tokens[..., None]).squeeze(-1)
    full_ids = head.draft_ids[tokens]
    verdict = judge_windows(
        runner, ids, lengths, full_ids.view(len(lengths), g, k), head.draft_ids,
        config.temperature, config.prox_reference,
    )  # fmt: skip
    uniforms = torch.rand(verdict.logp.shape, generator=generator)
    draft_logp = old_logp.view(len(lengths), g, k)
    accepted = accepted_length(verdict.logp, draft_logp, config.acceptance, uniforms, verdict.best)
    reward = speed_reward(accepted, gamma)
    prox = torch.zeros_like(reward)
    if config.proximity:
        prox = proximity_reward(
            accepted, verdict.logp.sum(-1), verdict.reference_logp[:, None], config
        )
        reward = reward + prox
    advantages = group_advantages(reward, config.adv_eps)
    return Rollouts(
        feats,
        lengths,
        tokens,
        old_logp,
        advantages.reshape(-1),
        verdict.draft_logp.reshape(len(lengths) * g, k, -1),
        reward.reshape(-1),
        accepted.reshape(-1),
        prox.reshape(-1),
    )
