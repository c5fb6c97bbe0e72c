"""An independent draft model (a smaller model sharing the target's tokenizer).

The draft cache follows the committed sequence by prefix reuse (one slot per batch row,
models.synced_cache): a proposal feeds whatever of the sequence is not yet cached (the last
committed token, an accepted last draft token plus the bonus, or a new turn of a conversation),
then drafts one token per forward.
"""

from __future__ import annotations

import time

import torch

from specpilot.config import SamplingConfig, require
from specpilot.drafting.chains import draft_chains
from specpilot.drafting.dynamic_tree import DynamicTree, ancestor_mask, grow, select_for
from specpilot.errors import ConfigError
from specpilot.models.runner import CausalRunner
from specpilot.models.synced_cache import sync
from specpilot.models.vocab import DraftVocabulary
from specpilot.policies.base import DraftPolicy
from specpilot.tree import DEFAULT_NODES
from specpilot.types import Proposal


class ModelDrafter:
    default_budget = None

    def __init__(
        self,
        runner: CausalRunner,
        vocabulary: DraftVocabulary | None = None,
        branches: int = 1,
        topk: int = 1,
        nodes: int = DEFAULT_NODES,
    ):
        """`vocabulary`: score only these ids (needs a runner with `run`/`logits_from_hidden`).
        `branches` > 1: propose trees, the draft's top `branches` first tokens (drafting.chains).
        `topk` > 1: EAGLE-2 dynamic trees (drafting.dynamic_tree) of `nodes` tokens, `topk`
        nodes expanded per level, as many levels as the policy's budget.
        """
        require(branches >= 1, f"branches must be >= 1 (1 drafts chains), got {branches}")
        require(topk >= 1 and nodes >= 1, f"tree topk and nodes must be >= 1, got {topk}, {nodes}")
        if topk > 1 and (branches > 1 or not hasattr(runner, "run")):
            raise ConfigError(
                "dynamic trees (topk > 1) need the lean decoder backend and no branches",
                ("branches",),
            )
        if vocabulary is not None and not hasattr(runner, "logits_from_hidden"):
            raise ConfigError(
                "a reduced draft vocabulary needs the lean decoder backend (Llama/Qwen2 family)"
            )
        self.runner = runner
        self.vocabulary = vocabulary
        self.branches = branches
        self.topk, self.nodes = topk, nodes
        self.head = None if vocabulary is None else vocabulary.head(runner.lm_head)

    @property
    def drafts_jointly(self) -> bool:
        """Chains: one draft forward per position serves every drafting row (a step costs as
        much as its deepest budget); trees grow one row at a time."""
        return self.topk == 1

    def reset(self) -> None:
        pass

    def clear_cache(self) -> None:
        self.runner.reset()

    def propose(
        self,
        sequences: list[list[int]],
        slots: list[int],
        budgets: list[int],
        policies: list[DraftPolicy],
        samplings: list[SamplingConfig],
        generators: list[torch.Generator | None],
    ) -> list[Proposal]:
        """Draft for every row at once: one draft forward per drafted position, over the rows
        still drafting (each row stops at its own budget or when its policy says so)."""
        if self.topk > 1:
            return [
                self._tree(sequence, slot, budget, policy)
                for sequence, slot, budget, policy in zip(
                    sequences, slots, budgets, policies, strict=True
                )
            ]
        feeds = [
            sync(self.runner, sequence, slot)
            for sequence, slot in zip(sequences, slots, strict=True)
        ]

        def score(rows: list[int], row_feeds: list[list[int]]) -> torch.Tensor:
            row_slots = [slots[j] for j in rows]
            outs = self.runner.forward_batch(row_feeds, row_slots, "last", self.head)
            for feed, slot in zip(row_feeds, row_slots, strict=True):
                self.runner.cached.add(slot, feed)
            return torch.cat(outs)

        return draft_chains(
            score, feeds, budgets, policies, samplings, generators, self.vocabulary, self.branches
        )

    def _tree(self, sequence: list[int], slot: int, depth: int, policy: DraftPolicy) -> Proposal:
        """Grow a dynamic tree in the slot's cache past the committed sequence, then forget it:
        the next sync feeds the accepted tokens again (one forward, as for a chain's bonus)."""
        if depth <= 0:
            return Proposal([])
        start = time.perf_counter()
        feed = sync(self.runner, sequence, slot)
        root = self.runner.forward_batch([feed], [slot], "last", self.head)[0][0]
        self.runner.cached.add(slot, feed)
        committed = len(sequence)
        tree = DynamicTree(self.topk, self.nodes)

        def to_id(index: int) -> int:
            return index if self.vocabulary is None else self.vocabulary.to_full_id(index)

        def score(level: int, frontier: list[int], fed: list[int]) -> torch.Tensor:
            out = self.runner.run(
                [to_id(tree.tokens[i]) for i in frontier],
                position_ids=torch.full((len(frontier),), committed - 1 + level),
                tree_mask=ancestor_mask(tree, fed, frontier, committed),
                logits="none",
                slot=slot,
            )
            return self.runner.logits_from_hidden(out.hidden, self.head)

        grow(tree, root, depth, policy, score, to_id, committed)
        self.runner.rollback(committed, slot=slot)
        if not tree.tokens:
            return Proposal([], draft_s=time.perf_counter() - start)
        tokens, parents = select_for(tree, policy, committed)
        seconds = time.perf_counter() - start
        return Proposal([to_id(t) for t in tokens], None, seconds, None, parents)
