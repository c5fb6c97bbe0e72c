"""DVI's self-drafter: the target's first `split` layers plus a LoRA-corrected copy of its head.

The draft tokens go through the same first layers the verifier would run on them, with the same
weights, so by default drafting writes those layers' keys/values straight into the target's
cache and keeps each drafted token's h_k (plus one extra shallow step for the last draft). The
engine then verifies through `SharedShallowTarget`, which runs only layers [split, L) on the
kept h_k instead of recomputing the shallow layers. With `share_cache=False` the drafter runs an
early-exit view with a cache of its own and the target verifies from layer 0 (the baseline that
shows what sharing saves).

`observe` hands the verified block to a learner (DVI's online training): for positions up to and
including the first reject, h_k, the drafted token, the verifier's logits and the 0/1 reward.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from specpilot.config import SamplingConfig, require
from specpilot.drafting.chains import draft_chains
from specpilot.drafting.dvi_head import DraftHead
from specpilot.errors import ConfigError
from specpilot.models.decoder import DecoderRunner
from specpilot.models.synced_cache import sync
from specpilot.models.vocab import DraftVocabulary
from specpilot.policies.base import DraftPolicy
from specpilot.types import Proposal


@dataclass
class DraftedBlock:
    """One row's last proposal: the fed tokens [last committed, d_1..d_n] from cache position
    `start` on, and their h_k."""

    start: int
    tokens: list[int]
    hidden: torch.Tensor  # [n + 1, hidden] with sharing, [n, hidden] without


@dataclass(frozen=True)
class VerifiedBlock:
    """What DVI learns from: positions 1..min(m + 1, n) of a verified block."""

    hidden: torch.Tensor  # [j, hidden] h_k that drafted each token
    draft_tokens: list[int]
    target_logits: torch.Tensor  # [j, vocab] the verifier's logits at those positions
    rewards: list[float]  # 1 accepted, 0 the first reject
    prev_tokens: list[int]


class LayerSplitDrafter:
    default_budget = None
    drafts_jointly = True
    """One shallow forward per position serves every drafting row."""

    def __init__(
        self,
        target: DecoderRunner,
        head: DraftHead,
        share_cache: bool = True,
        explore_temperature: float = 0.0,
        learner=None,
        branches: int = 1,
    ):
        """`explore_temperature` > 0: sample drafts at that temperature even when decoding is
        greedy (DVI's training rollouts; greedy verification keeps the output exact).
        `learner`: receives every VerifiedBlock (see observe). `branches` > 1: propose trees,
        the head's top `branches` first tokens (drafting.chains); their shallow layers run in
        verification, so trees need the drafter's own cache (share_cache False)."""
        require(branches >= 1, f"branches must be >= 1 (1 drafts chains), got {branches}")
        if share_cache and branches > 1:
            raise ConfigError(
                "a DVI tree (branches > 1) cannot share the shallow KV cache: its alternatives "
                "are not drafted through the shallow layers; pass share_cache=0"
            )
        self.branches = branches
        self.runner = target
        self.head = head
        self.split = head.shape.split
        self.share_cache = share_cache
        self.explore = SamplingConfig(explore_temperature) if explore_temperature > 0 else None
        self.vocabulary = (
            None
            if head.token_ids is None
            else DraftVocabulary(head.token_ids.cpu(), head.shape.vocab_size)
        )
        self.learner = learner
        if share_cache:
            self.shallow = target
            self.target = SharedShallowTarget(target, self)
        else:
            self.shallow = target.early_exit(self.split)
            self.target = target
        self.blocks: dict[int, DraftedBlock] = {}

    def verifier(self, target: DecoderRunner) -> DecoderRunner | SharedShallowTarget:
        """The runner the engine verifies through: with cache sharing, the view of `target` that
        skips the shallow layers drafting already ran."""
        if target is not self.runner:
            raise ConfigError("this DVI drafter was built on another target; build it on this one")
        return self.target

    def summary(self) -> str | None:
        """Online learning progress (`--learn`), else None."""
        if self.learner is None:
            return None
        return f"dvi --learn: {self.learner.updates} updates over {self.learner.step} steps"

    def save(self, path: str) -> None:
        """Save the head (the adapter `--learn` trained)."""
        self.head.save(path)

    def reset(self) -> None:
        self.blocks = {}

    def clear_cache(self) -> None:
        self.shallow.reset()  # the target itself when sharing its cache

    def _shallow(self, feeds: list[list[int]], slots: list[int]) -> list[torch.Tensor]:
        """Run the first `split` layers over each row's tokens; per row its h_k rows."""
        outs = self.shallow.run_batch(feeds, slots, end_layer=self.split, logits="none")
        if not self.share_cache:  # its own early-exit cache, every layer fed
            for feed, slot in zip(feeds, slots, strict=True):
                self.shallow.cached.add(slot, feed)
        return [out.hidden for out in outs]

    def propose(
        self,
        sequences: list[list[int]],
        slots: list[int],
        budgets: list[int],
        policies: list[DraftPolicy],
        samplings: list[SamplingConfig],
        generators: list[torch.Generator | None],
    ) -> list[Proposal]:
        start = time.perf_counter()
        for slot in slots:
            self.blocks.pop(slot, None)
        if self.share_cache:
            feeds = [sequence[-1:] for sequence in sequences]
        else:
            feeds = [
                sync(self.shallow, seq, slot) for seq, slot in zip(sequences, slots, strict=True)
            ]
        hidden: list[list[torch.Tensor]] = [[] for _ in sequences]

        def score(rows: list[int], row_feeds: list[list[int]]) -> torch.Tensor:
            last = torch.cat([h[-1:] for h in self._shallow(row_feeds, [slots[j] for j in rows])])
            for j, h in zip(rows, last, strict=True):
                hidden[j].append(h[None])
            with torch.no_grad():
                return self.head(last)

        proposals = draft_chains(
            score,
            feeds,
            budgets,
            policies,
            [self.explore or sampling for sampling in samplings],
            generators,
            self.vocabulary,
            self.branches,
        )
        # A row whose policy drafted nothing still ran the shallow layers on its last token: its
        # block keeps that h_k, so the plain step that verifies it runs only the deep layers.
        ran = [j for j in range(len(sequences)) if hidden[j]]
        drafted = [j for j in ran if proposals[j].tokens]
        if self.share_cache and drafted:
            # One more shallow step, so the verifier has h_k of the last draft too.
            last_tokens = [proposals[j].tokens[-1:] for j in drafted]
            shallow = self._shallow(last_tokens, [slots[j] for j in drafted])
            for j, h in zip(drafted, shallow, strict=True):
                hidden[j].append(h)
        for j in ran:
            self.blocks[slots[j]] = DraftedBlock(
                len(sequences[j]) - 1,
                sequences[j][-1:] + proposals[j].tokens[: proposals[j].chain_length],
                torch.cat(hidden[j]),
            )
        seconds = time.perf_counter() - start
        return [dataclasses.replace(proposal, draft_s=seconds) for proposal in proposals]

    def observe(
        self, slot: int, proposal: Proposal, target_logits: torch.Tensor, num_accepted: int
    ) -> None:
        """Called by the engine after verifying `proposal` (the verified prefix) of `slot`."""
        block = self.blocks.get(slot)
        if self.learner is None or block is None or not proposal.tokens:
            return
        logged = min(num_accepted + 1, proposal.k)
        self.learner.add_block(
            VerifiedBlock(
                hidden=block.hidden[:logged],
                draft_tokens=proposal.tokens[:logged],
                target_logits=target_logits[:logged],
                rewards=[1.0] * min(num_accepted, logged) + [0.0] * (logged - num_accepted),
                prev_tokens=block.tokens[:logged],
            ),
            proposal.k,
        )


class SharedShallowTarget:
    """The target as the engine sees it under cache sharing: a row that starts with the tokens
    just drafted skips layers [0, split), whose keys/values and h_k drafting already computed.
    Everything else is the wrapped runner's. It verifies chains only."""

    supports_trees = False

    def __init__(self, runner: DecoderRunner, drafter: LayerSplitDrafter):
        self.runner = runner
        self.drafter = drafter

    def __getattr__(self, name: str):
        return getattr(self.runner, name)

    def forward_batch(self, rows, slots, logits="all", head=None) -> list[torch.Tensor | None]:
        split = self.drafter.split
        hidden: list[torch.Tensor | list] = [[] for _ in rows]
        missing = []
        for j, (row, slot) in enumerate(zip(rows, slots, strict=True)):
            deep_length = self.runner.slot_lengths[slot][split]
            block = self.drafter.blocks.get(slot)
            fresh = block is not None and block.start == deep_length
            if row and fresh and block.tokens[: len(row)] == list(row):
                hidden[j] = block.hidden[: len(row)]
                self.runner.rollback(deep_length + len(row), range(split), slot)
            else:
                self.runner.rollback(deep_length, range(split), slot)
                missing.append(j)
        if missing:
            outs = self.runner.run_batch(
                [rows[j] for j in missing],
                [slots[j] for j in missing],
                end_layer=split,
                logits="none",
            )
            for j, out in zip(missing, outs, strict=True):
                hidden[j] = [] if out is None else out.hidden
        outs = self.runner.run_batch(hidden, slots, start_layer=split, logits=logits, head=head)
        return [None if out is None else out.logits for out in outs]
