"""The feature drafter (EAGLE-3 head, EAGLE-2 dynamic trees): drafts from the target's own
hidden states at a few percent of a target step.

The engine hands the drafter the target's taps at its feature layers for every position the
target commits (after the prefill and after each verification, from forwards that run anyway:
no extra target pass), through `take_features(slot, start, taps)`. Invariant: a slot's features
cover exactly the positions the target's cache holds, 0..len(sequence) − 2.

A proposal first catches the head's own cache up: position t holds the pair (target feature at
t, embedding of token t + 1) for every committed t not yet fed, in one block call whose last
output is the root's draft distribution. Then it drafts:
- a chain (`topk` 1): one block call per token, each fed the previous call's output (EAGLE's
  training-time-test regime); sampled from q when sampling, so the verifier's rejection rule
  applies as to any chain;
- a tree (`topk` > 1): EAGLE-2 expansion (`dynamic_tree`), `depth` block calls over the frontier
  with ancestor masks, then the best `nodes` candidates. Tree nodes are deterministic (top-k), so
  verification treats each as one-hot: lossless under sampling as well.
With `lookup` > 0 the prompt-lookup continuation (up to `lookup` tokens that followed the last
earlier occurrence of the sequence's final n-gram) is hung from the root as one more branch
(`tree.graft`): free to find, and where an answer repeats its prompt or itself (code, quoted
numbers) it runs past the head's depth. Its nodes are deterministic, so verification stays
exact. Draft-tree entries live past the committed pairs in the head's cache and are overwritten
by the next catch-up. The row's DraftPolicy caps the depth (its budget) and may stop early after
each level, judged on the best frontier node (SVIP's rule on trees, as LTD's Appendix A.1 applies
it); the lookup branch is not the head's draft and is left to neither.
"""

from __future__ import annotations

import copy
import time

import torch

from specpilot.config import SamplingConfig, require
from specpilot.drafting.dynamic_tree import DynamicTree, ancestor_mask, grow, select_for
from specpilot.drafting.eagle_head import EagleHead
from specpilot.drafting.eagle_inputs import HeadInputs
from specpilot.drafting.ngram import NgramDrafter
from specpilot.errors import ConfigError
from specpilot.models.synced_cache import common_prefix_length
from specpilot.models.vocab import DraftVocabulary
from specpilot.policies.base import DraftPolicy, DraftToken
from specpilot.sampling import logits_to_probs, sample
from specpilot.tree import DEFAULT_DEPTH, DEFAULT_NODES, DEFAULT_TOPK, graft
from specpilot.types import Proposal

TREE_CAPACITY = 1024
"""Cache positions reserved past the committed pairs for draft-tree entries."""
FUSE_BLOCK = 64
"""Committed positions whose taps wait to be fused together: until a draft needs them, or this
many (a bound on the raw taps a slot keeps)."""


class _Slot:
    """One cache slot's head state: the target's fused features, the pairs fed, the cache."""

    def __init__(self, head: EagleHead, max_length: int, dtype, device):
        s = head.shape
        shape = (s.num_kv_heads, max_length + TREE_CAPACITY, s.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.features = torch.zeros(max_length, s.hidden_size, dtype=dtype, device=device)
        self.count = 0
        """Positions 0..count − 1 have target features."""
        self.fused = 0
        """Positions 0..fused − 1 hold fused features in `features`; fused..count − 1 wait in
        `taps`, raw (fused = count after `fuse`)."""
        self.taps = torch.zeros(
            0, s.hidden_size * len(s.feature_layers), dtype=dtype, device=device
        )
        self.fed = 0
        """Pairs in the cache (positions 0..fed − 1); fed <= count."""
        self.tokens: list[int] = []
        """The tokens at positions 0..count − 1 (what the features were computed on)."""

    def take(self, head: EagleHead, start: int, taps: torch.Tensor) -> None:
        """Positions start.. get these raw taps ([n, layers · h]), replacing what they held."""
        taps = taps.to(self.features.dtype)
        if start < self.fused:
            self.fused, self.taps = start, taps
        else:
            self.taps = torch.cat([self.taps[: start - self.fused], taps])
        self.count = start + taps.shape[0]
        if self.taps.shape[0] >= FUSE_BLOCK:
            self.fuse(head)

    def truncate(self, count: int) -> None:
        """Keep positions 0..count − 1 only."""
        self.count = count
        self.fused = min(self.fused, count)
        self.taps = self.taps[: count - self.fused]
        del self.tokens[count:]

    def fuse(self, head: EagleHead) -> None:
        """Fuse the waiting taps in one product (a row at a time cost ~1 ms per committed token
        of the 1.5B, 2 threads: as much as the taps themselves while nothing is drafted)."""
        if self.taps.shape[0]:
            self.features[self.fused : self.count] = head.fuse(self.taps)
            self.fused, self.taps = self.count, self.taps[:0]


class EagleDrafter:
    drafts_jointly = False
    """Each row's head runs on its own."""

    def __init__(
        self,
        target,
        head: EagleHead,
        depth: int = DEFAULT_DEPTH,
        topk: int = DEFAULT_TOPK,
        nodes: int = DEFAULT_NODES,
        lookup: int = 0,
        inputs: HeadInputs | None = None,
    ):
        """`target`: the runner of the target the head was trained for (the lean decoder or
        ggml); `inputs`: its embedding, rotary tables and the head's dtype (default: a lean
        decoder's own, HeadInputs.of_decoder). topk 1 drafts chains; `lookup` > 0 adds a
        prompt-lookup branch of at most that many tokens."""
        require(depth >= 1, f"eagle depth must be >= 1, got {depth}")
        require(topk >= 1, f"eagle topk must be >= 1, got {topk}")
        require(nodes >= 1, f"eagle nodes must be >= 1, got {nodes}")
        require(lookup >= 0, f"eagle lookup must be >= 0 (0: no lookup branch), got {lookup}")
        require(
            (depth - 1) * topk <= TREE_CAPACITY,
            f"a tree of depth {depth} and top-k {topk} feeds {(depth - 1) * topk} entries; the "
            f"drafter's cache reserves {TREE_CAPACITY}: lower tree_depth or tree_topk",
            ("tree_depth", "tree_topk"),
        )
        if not hasattr(target, "run_batch"):
            raise ConfigError(
                "the eagle drafter reads the target's hidden states: serve the target with the "
                "lean decoder backend (Llama/Qwen2 family) or the ggml backend"
            )
        self.target = target
        self.inputs = inputs = inputs or HeadInputs.of_decoder(target)
        if hasattr(target, "enable_taps"):  # ggml: a context whose forwards can tap layers
            target.enable_taps()
        self.head = copy.deepcopy(head).to(dtype=inputs.dtype, device=inputs.device).eval()
        self.head.requires_grad_(False)
        self.vocabulary = DraftVocabulary(self.head.draft_ids.cpu(), target.vocab_size)
        self.depth, self.topk, self.nodes, self.lookup = depth, topk, nodes, lookup
        self.prompt_lookup = NgramDrafter()
        self.feature_layers = head.shape.feature_layers
        self.default_budget = depth
        self.slots: list[_Slot] = []
        self.clear_cache()

    def reset(self) -> None:
        """Nothing per request: a slot's features and cache are reused as far as the next
        request's prompt agrees with them (`reusable`)."""

    def clear_cache(self) -> None:
        if len(self.slots) != self.target.batch_size:
            self.slots = [
                _Slot(self.head, self.target.max_length, self.inputs.dtype, self.inputs.device)
                for _ in range(self.target.batch_size)
            ]
        for state in self.slots:  # stale keys/values past `fed` are never read
            state.count = state.fed = state.fused = 0
            state.taps = state.taps[:0]
            state.tokens = []

    def reusable(self, slot: int, sequence: list[int]) -> int:
        """How many leading positions of `sequence` this slot holds features for: the engine
        keeps no more of the target's cache (whose forwards would have given them)."""
        state = self.slots[slot]
        return min(common_prefix_length(state.tokens, sequence), state.count)

    # -- features from the engine -----------------------------------------------------------
    @torch.inference_mode()
    def take_features(self, slot: int, start: int, taps: torch.Tensor, tokens: list[int]) -> None:
        """The target committed `tokens` at positions start..start + n − 1 of `slot` with these
        taps ([n, layers · hidden]); anything the slot held from `start` on is replaced."""
        state = self.slots[slot]
        if start > state.count:
            raise RuntimeError(f"slot {slot}: features jump from position {state.count} to {start}")
        state.take(self.head, start, taps)
        # The pair at position t also embeds token t + 1, which may change from `start` on.
        state.fed = min(state.fed, max(start - 1, 0))
        state.tokens[start:] = tokens

    # -- drafting ----------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(
        self,
        sequences: list[list[int]],
        slots: list[int],
        budgets: list[int],
        policies: list[DraftPolicy],
        samplings: list[SamplingConfig],
        generators: list[torch.Generator | None],
    ) -> list[Proposal]:
        proposals = []
        for sequence, slot, budget, policy, sampling, generator in zip(
            sequences, slots, budgets, policies, samplings, generators, strict=True
        ):
            start = time.perf_counter()
            if budget <= 0:
                proposals.append(Proposal([]))
                continue
            state = self.slots[slot]
            if state.count > len(sequence) - 1:  # a reused prefix (`reusable`): drop the rest
                state.truncate(len(sequence) - 1)
            if state.count == 0:  # a one-token prompt: no target feature yet
                proposals.append(Proposal([]))
                continue
            root = self._catch_up(state, sequence, slot)
            depth = min(self.depth, budget)
            if self.topk == 1:
                proposal = self._chain(state, sequence, root, depth, policy, sampling, generator)
            else:
                proposal = self._tree(state, sequence, root, depth, policy)
            if self.lookup:
                proposal = self._with_lookup(proposal, sequence)
            proposals.append(
                Proposal(
                    proposal.tokens,
                    proposal.draft_probs,
                    time.perf_counter() - start,
                    proposal.draft_logits,
                    proposal.parents,
                )
            )
        return proposals

    def _catch_up(self, state: _Slot, sequence: list[int], slot: int) -> torch.Tensor:
        """Feed the committed pairs not yet in the cache (at least the last one, whose output
        drafts the next token); return that last output [1, h]."""
        if state.count != len(sequence) - 1:
            raise RuntimeError(
                f"slot {slot}: the eagle drafter holds features of {state.count} positions but "
                f"the sequence has {len(sequence)} tokens; the engine must pass the target's taps "
                "after every prefill and verification"
            )
        state.fuse(self.head)
        fed = state.fed = min(state.fed, state.count - 1)
        n = state.count - fed
        positions = torch.arange(fed, fed + n, device=self.inputs.device)
        out, k, v = self.head.block(
            state.features[fed : fed + n],
            self.inputs.embed(sequence[fed + 1 : fed + n + 1]),
            self.inputs.cos[positions],
            self.inputs.sin[positions],
            state.k[:, :fed],
            state.v[:, :fed],
        )
        state.k[:, fed : fed + n] = k
        state.v[:, fed : fed + n] = v
        state.fed = state.count
        return out[-1:]

    def _step(self, state: _Slot, hidden, tokens: list[int], depth_position: int, used: int, mask):
        """Feed draft entries (parent outputs `hidden`, their tokens) at rotary position
        `depth_position` into cache rows fed + used.. with additive `mask` over the cache."""
        n = len(tokens)
        row = state.fed + used
        position = torch.full((n,), depth_position, device=self.inputs.device)
        out, k, v = self.head.block(
            hidden,
            self.inputs.embed(tokens),
            self.inputs.cos[position],
            self.inputs.sin[position],
            state.k[:, :row],
            state.v[:, :row],
            mask,
        )
        state.k[:, row : row + n] = k
        state.v[:, row : row + n] = v
        return out

    @torch.inference_mode()
    def draft_step(
        self, slot: int, hidden: torch.Tensor, tokens: list[int], context: int
    ) -> torch.Tensor:
        """One draft level right after `context` committed pairs of `slot`: the block over the
        entries (parent outputs `hidden` [n, h], their `tokens`), then the head's logits
        [n, draft vocab]; what a chain step (n = 1) or a tree level costs (bench.profile). The
        slot counts `context` pairs as fed; the next proposal's catch-up refeeds what it must."""
        state = self.slots[slot]
        state.fed = context
        return self.head.logits(self._step(state, hidden, tokens, context, 0, None))

    def _chain(self, state, sequence, root, depth, policy, sampling, generator) -> Proposal:
        tokens, probs, raw = [], [], []
        hidden = root
        for index in range(depth):
            logits = self.head.logits(hidden)[0]
            if not policy.admits(logits):
                break
            if sampling.greedy:
                choice = int(logits.argmax())
            else:
                row_probs = logits_to_probs(logits, sampling)
                choice = sample(row_probs, generator)
                probs.append(self.vocabulary.to_full_probs(row_probs))
            token = self.vocabulary.to_full_id(choice)
            tokens.append(token)
            raw.append(logits)
            if not policy.continue_drafting(DraftToken(index, token, logits)):
                break
            if index + 1 < depth:
                hidden = self._step(state, hidden, [token], len(sequence) - 1 + index, index, None)
        return Proposal(
            tokens,
            torch.stack(probs) if probs else None,
            0.0,
            torch.stack(raw) if raw else None,
        )

    def _with_lookup(self, proposal: Proposal, sequence: list[int]) -> Proposal:
        """`proposal` with the prompt-lookup continuation grafted from the root (a chain
        becomes a tree whose first path is that chain; unchanged where lookup adds nothing)."""
        branch = self.prompt_lookup.lookup(sequence, self.lookup)
        parents = proposal.parents
        if parents is None:
            parents = tuple(range(-1, proposal.k - 1))
        tokens, parents = graft(proposal.tokens, parents, branch)
        if len(tokens) == proposal.k:
            return proposal
        return Proposal(tokens, proposal.draft_probs, 0.0, proposal.draft_logits, parents)

    def grow_tree(self, slot: int, sequence: list[int], depth: int, policy) -> DynamicTree:
        """Catch up and grow the slot's draft tree for `sequence` (its features must cover
        len(sequence) − 1 positions), unselected: what LTD's replay logs record."""
        state = self.slots[slot]
        root = self._catch_up(state, sequence, slot)
        return self._grow(state, sequence, root, depth, policy)

    def _tree(self, state: _Slot, sequence: list[int], root, depth: int, policy) -> Proposal:
        tree = self._grow(state, sequence, root, depth, policy)
        if not tree.tokens:
            return Proposal([])
        tokens, parents = select_for(tree, policy, len(sequence))
        return Proposal([self.vocabulary.to_full_id(t) for t in tokens], None, 0.0, None, parents)

    def _grow(self, state: _Slot, sequence: list[int], root, depth: int, policy) -> DynamicTree:
        tree = DynamicTree(self.topk, self.nodes)
        outputs = {-1: root[0]}

        def feed(level: int, frontier: list[int], fed: list[int]) -> torch.Tensor:
            hidden = torch.stack([outputs[tree.parents[i]] for i in frontier])
            allowed = ancestor_mask(tree, fed, frontier, state.fed)
            mask = torch.zeros(allowed.shape, dtype=self.inputs.dtype)
            mask = mask.masked_fill_(~allowed, float("-inf")).to(self.inputs.device)
            tokens = [self.vocabulary.to_full_id(tree.tokens[i]) for i in frontier]
            out = self._step(state, hidden, tokens, len(sequence) - 1 + level, len(fed), mask)
            outputs.update(zip(frontier, out, strict=True))
            return self.head.logits(out)

        root_logits = self.head.logits(root)[0]
        grow(tree, root_logits, depth, policy, feed, self.vocabulary.to_full_id, len(sequence))
        return tree
