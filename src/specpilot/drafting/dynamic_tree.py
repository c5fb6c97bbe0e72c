"""EAGLE-2's dynamic draft tree (Li et al. 2024): expand the most promising nodes, rerank all.

Every node carries the cumulative log-probability of its path under the draft model, an
estimate of the chance that the target accepts the whole path. Each expansion step scores the
`topk` frontier nodes' children; all topk × topk children join the candidate pool and the best
`topk` of them (by cumulative score) become the next frontier. After the last step the best
`nodes` candidates form the tree the target verifies. A child's score never exceeds its
parent's (log-probabilities are <= 0; ties are broken towards shallower nodes), so the best
`nodes` always include each chosen node's ancestors.

`DynamicTree` is pure bookkeeping over token indices and scores; `grow` runs the expansion
loop for any drafter through a `feed` callback that scores the frontier (each drafter keeps its
own cache), and `ancestor_mask` says what each fed node may attend to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specpilot.config import require
from specpilot.policies.base import DraftPolicy, DraftToken, TreePolicy

Feed = Callable[[int, list[int], list[int]], torch.Tensor]
"""feed(level, frontier, fed) → [len(frontier), vocab] logits: write the frontier nodes (depth
`level`) into the drafter's cache after the already `fed` nodes and score what follows each."""


@dataclass
class DynamicTree:
    topk: int
    nodes: int
    tokens: list[int] = field(default_factory=list)
    """Per candidate node: its token (an index of the draft's vocabulary)."""
    parents: list[int] = field(default_factory=list)
    """Per candidate node: its parent node, −1 for the root's children."""
    scores: list[float] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    frontier: list[int] = field(default_factory=list)
    """The nodes whose children the next expansion scores, best first."""
    level_starts: list[int] = field(default_factory=list)
    """Per level grown: the index of its first node (level d holds nodes level_starts[d − 1]..)."""

    def __post_init__(self) -> None:
        require(self.topk >= 1, f"tree topk must be >= 1, got {self.topk}")
        require(self.nodes >= 1, f"tree nodes must be >= 1, got {self.nodes}")

    def expand(self, logprobs: torch.Tensor) -> None:
        """Add the children of the root (first call, logprobs [1, vocab]) or of the current
        frontier (logprobs [len(frontier), vocab], in frontier order)."""
        parents = self.frontier if self.tokens else [-1]
        require(logprobs.shape[0] == len(parents), "one row of log-probabilities per parent")
        k = min(self.topk, logprobs.shape[-1])
        top = logprobs.float().cpu().topk(k, dim=-1)
        base = torch.tensor([self.scores[p] if p >= 0 else 0.0 for p in parents])
        cumulative = (base[:, None] + top.values).flatten()
        first = len(self.tokens)
        self.level_starts.append(first)
        for row, parent in enumerate(parents):
            depth = 1 if parent < 0 else self.depths[parent] + 1
            for col in range(k):
                self.tokens.append(int(top.indices[row, col]))
                self.parents.append(parent)
                self.scores.append(float(cumulative[row * k + col]))
                self.depths.append(depth)
        best = torch.sort(-cumulative, stable=True).indices[: self.topk]
        self.frontier = [first + int(i) for i in best]

    @property
    def levels(self) -> int:
        return len(self.level_starts)

    def best(self) -> int:
        """The frontier node most likely to be accepted (highest cumulative score)."""
        return self.frontier[0]

    def ranking(self) -> list[int]:
        """Every candidate, most likely first (ties: shallower, then earlier): a node always
        ranks after its ancestors, so any leading slice is a tree."""
        return sorted(range(len(self.tokens)), key=lambda i: (-self.scores[i], self.depths[i], i))

    def select(self, nodes: int | None = None) -> tuple[list[int], tuple[int, ...]]:
        """The best `nodes` (default: the tree's own) candidates as (tokens, parents): the best
        path first (the chain a chain drafter would have proposed), then the rest by score;
        parents precede children."""
        ranked = self.ranking()[: self.nodes if nodes is None else nodes]
        kept = set(ranked)
        chain = []
        node = next((i for i in ranked if self.depths[i] == 1), None)
        while node is not None:
            chain.append(node)
            children = [i for i in ranked if self.parents[i] == node]
            node = children[0] if children else None
        order = chain + [i for i in ranked if i not in set(chain)]
        assert all(self.parents[i] < 0 or self.parents[i] in kept for i in order)
        position = {node: j for j, node in enumerate(order)}
        tokens = [self.tokens[i] for i in order]
        parents = tuple(-1 if self.parents[i] < 0 else position[self.parents[i]] for i in order)
        return tokens, parents


def grow(
    tree: DynamicTree,
    root_logits: torch.Tensor,
    depth: int,
    policy: DraftPolicy,
    feed: Feed,
    token_id: Callable[[int], int],
    context_len: int,
) -> None:
    """Expand `tree` from the root's draft logits for at most `depth` levels. After each level
    a TreePolicy (LTD) decides from the tree's scores whether to pay for another level; then
    the policy judges the best frontier node's own distribution (SVIP on trees: stop growing
    when the node most likely to be accepted is uncertain); `token_id` maps a draft index to a
    target id for the policy; `context_len` is the committed sequence's length."""
    if not policy.admits(root_logits):
        return
    tree.expand(torch.log_softmax(root_logits[None].float(), dim=-1))
    shaper = policy if isinstance(policy, TreePolicy) else None
    fed: list[int] = []
    for level in range(1, depth):
        if shaper is not None and not shaper.continue_tree(tree, context_len):
            return
        frontier, best = list(tree.frontier), tree.best()
        logits = feed(level, frontier, fed)
        fed.extend(frontier)
        best_logits = logits[frontier.index(best)]
        drafted = DraftToken(level - 1, token_id(tree.tokens[best]), best_logits)
        if not (policy.continue_drafting(drafted) and policy.admits(best_logits)):
            return
        tree.expand(torch.log_softmax(logits.float(), dim=-1))


def select_for(
    tree: DynamicTree, policy: DraftPolicy, context_len: int
) -> tuple[list[int], tuple[int, ...]]:
    """The candidates to verify: as many as a TreePolicy says, else the tree's own count."""
    size = policy.tree_size(tree, context_len) if isinstance(policy, TreePolicy) else None
    return tree.select(size)


def ancestor_mask(
    tree: DynamicTree, fed: list[int], frontier: list[int], committed: int
) -> torch.Tensor:
    """[len(frontier), committed + len(fed) + len(frontier)] bool over a cache holding the
    committed positions, then the fed nodes in order, then the frontier: each frontier node sees
    every committed position, its fed ancestors and itself."""
    where = {node: i for i, node in enumerate(fed)}
    n, m = len(frontier), len(fed)
    allowed = torch.zeros(n, committed + m + n, dtype=torch.bool)
    allowed[:, :committed] = True
    for row, node in enumerate(frontier):
        allowed[row, committed + m + row] = True
        parent = tree.parents[node]
        while parent >= 0:
            allowed[row, committed + where[parent]] = True
            parent = tree.parents[parent]
    return allowed
