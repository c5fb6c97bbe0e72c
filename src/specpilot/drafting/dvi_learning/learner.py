"""DVI's online learner: log verified blocks, and every `rollout_blocks` blocks update the head
(`updates_per_step` times; once in the paper).

One update (DVI paper §3.4, with the choices of docs/methods.md §3.3): a uniform minibatch from
the replay buffer gives λ_pg·L_pg + λ_kl·KL + w_ce·L_CE − w_ent·H; once the RL phase starts, the
tuples of the latest rollout (accepted and first-reject, on-policy) add w_rl·REINFORCE with an
EMA baseline plus β(t)·KL(p_target ‖ p_draft); one AdamW step on the sum, gradients clipped.
h_k does not depend on the trained LoRA (it sits on the head only), so stored h_k are exact
inputs for later updates.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from specpilot.drafting.dvi_head import DraftHead
from specpilot.drafting.dvi_learning import losses
from specpilot.drafting.dvi_learning.buffer import Batch, ReplayBuffer
from specpilot.drafting.dvi_learning.config import DviTrainConfig
from specpilot.drafting.dvi_learning.schedule import LossWeights, loss_weights
from specpilot.drafting.layer_split import VerifiedBlock


class DviLearner:
    def __init__(
        self,
        head: DraftHead,
        config: DviTrainConfig | None = None,
        on_step: Callable[[dict], None] | None = None,
        max_steps: int | None = None,
    ):
        """`on_step(metrics)` is called after every training step; after `max_steps` steps the
        learner stops learning (blocks are ignored)."""
        self.head = head
        self.config = config or DviTrainConfig()
        self.on_step = on_step
        self.max_steps = max_steps
        self.optimizer = torch.optim.AdamW(
            [
                {"params": head.lora_parameters()},
                {"params": [head.log_scale], "lr": self.config.scale_lr, "weight_decay": 0.0},
            ],
            lr=self.config.lr,
            betas=(0.9, 0.999),
            eps=1e-8,
            weight_decay=self.config.weight_decay,
        )
        dtype = head.rows.dtype
        self.buffer = ReplayBuffer(
            self.config.buffer_capacity, head.shape.hidden_size, head.num_scored, dtype
        )
        self.generator = torch.Generator().manual_seed(self.config.seed)
        self.index_of = (
            None
            if head.token_ids is None
            else {int(t): i for i, t in enumerate(head.token_ids.tolist())}
        )
        self.step = 0
        self.updates = 0
        self.baseline = 0.0
        self._start_step()

    def _start_step(self) -> None:
        self.fresh: list[int] = []
        self.blocks = 0
        self.drafted = 0
        self.accepted = 0

    @property
    def done(self) -> bool:
        return self.max_steps is not None and self.step >= self.max_steps

    def add_block(self, block: VerifiedBlock, num_drafted: int) -> None:
        """Log one verified block (`num_drafted` tokens were verified); update when a step's
        worth of blocks is in."""
        if self.done:
            return
        n = len(block.draft_tokens)
        tokens = torch.tensor(block.draft_tokens, dtype=torch.long)
        target_logits = block.target_logits
        if self.index_of is not None:
            tokens = torch.tensor([self.index_of[t] for t in block.draft_tokens])
            target_logits = target_logits[:, self.head.token_ids.to(target_logits.device)]
        rewards = torch.tensor(block.rewards)
        self.fresh += self.buffer.add(
            Batch(
                hidden=block.hidden.cpu(),
                actions=tokens,
                target_logits=target_logits.cpu(),
                rewards=rewards,
                positions=torch.arange(1, n + 1),
                prev_tokens=torch.tensor(block.prev_tokens, dtype=torch.long),
            )
        )
        self.blocks += 1
        self.drafted += num_drafted
        self.accepted += int(rewards.sum())
        if self.blocks == self.config.rollout_blocks:
            self._finish_step()

    def _finish_step(self) -> None:
        metrics = {
            "step": self.step,
            "acceptance": self.accepted / max(1, self.drafted),
            "drafted": self.drafted,
            "accepted": self.accepted,
        }
        if len(self.buffer) >= self.config.batch_size:
            metrics.update(self.update_step())
        metrics["updates"] = self.updates
        self.step += 1
        self._start_step()
        if self.on_step is not None:
            self.on_step(metrics)

    def losses(self, weights: LossWeights, replay: Batch, fresh: Batch | None) -> dict:
        """Every loss term with a non-zero weight, and their weighted sum under "loss"."""
        config = self.config
        device = self.head.rows.device
        replay = replay.to(device)
        fresh = None if fresh is None else fresh.to(device)
        terms: dict[str, torch.Tensor] = {}
        replay_needed = weights.pg or weights.kl or weights.ce or weights.entropy
        if replay_needed:
            logits = self.head(replay.hidden)
            target = replay.target_logits
            if weights.pg:
                terms["pg"] = losses.reward_masked_nll(logits, replay.actions, replay.rewards)
            if weights.kl:
                terms["kl"] = losses.distill_kl(
                    logits, target, config.kl_temperature, config.kl_direction
                )
            if weights.ce:
                labels = (
                    target.argmax(-1) if config.ce_target == "verifier_argmax" else replay.actions
                )
                terms["ce"] = losses.cross_entropy(logits, labels)
            if weights.entropy:
                terms["entropy"] = losses.entropy(logits)
        total = (
            weights.pg * terms.get("pg", 0.0)
            + weights.kl * terms.get("kl", 0.0)
            + weights.ce * terms.get("ce", 0.0)
            - weights.entropy * terms.get("entropy", 0.0)
        )
        if weights.policy and fresh is not None:
            logits = self.head(fresh.hidden)
            terms["reinforce"] = losses.reinforce(
                logits, fresh.actions, fresh.rewards, self.baseline
            )
            total = total + config.rl_weight * terms["reinforce"]
            if weights.anchor:
                terms["anchor_kl"] = losses.distill_kl(logits, fresh.target_logits)
                total = total + weights.anchor * terms["anchor_kl"]
        terms["loss"] = total
        return terms

    def update_step(self) -> dict:
        """A training step's updates; returns the last one's loss terms and schedule values.
        The schedule's t is the number of earlier steps that updated; the on-policy batch (this
        step's tuples) and the EMA baseline are the same for each of the step's updates."""
        weights = loss_weights(self.updates // self.config.updates_per_step, self.config)
        fresh = None
        if weights.policy and self.fresh:
            fresh = self.buffer.gather(self.fresh)
            decay = self.config.baseline_decay
            self.baseline = decay * self.baseline + (1 - decay) * float(fresh.rewards.mean())
        for _ in range(self.config.updates_per_step):
            metrics = self.update(weights, fresh)
        return metrics

    def update(self, weights: LossWeights, fresh: Batch | None) -> dict:
        """One optimizer update on a fresh minibatch from the buffer."""
        replay = self.buffer.sample(self.config.batch_size, self.generator)
        self.head.train()
        with torch.enable_grad():
            terms = self.losses(weights, replay, fresh)
            self.optimizer.zero_grad(set_to_none=True)
            if torch.is_tensor(terms["loss"]) and terms["loss"].requires_grad:
                terms["loss"].backward()
                torch.nn.utils.clip_grad_norm_(
                    self.head.trainable_parameters(), self.config.grad_clip
                )
                self.optimizer.step()
        self.head.eval()
        self.updates += 1
        out = {name: float(torch.as_tensor(value).detach()) for name, value in terms.items()}
        out.update(lambda_pg=weights.pg, lambda_kl=weights.kl, beta=weights.anchor)
        out["baseline"] = self.baseline
        return {k: v for k, v in out.items() if math.isfinite(v)}

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "buffer": self.buffer.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "counters": {
                "step": self.step,
                "updates": self.updates,
                "baseline": self.baseline,
                "fresh": list(self.fresh),
                "blocks": self.blocks,
                "drafted": self.drafted,
                "accepted": self.accepted,
            },
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore everything but the LoRA weights (the adapter folder holds those)."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        for name, value in state["counters"].items():
            setattr(self, name, value)
