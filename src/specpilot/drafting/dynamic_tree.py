"""EAGLE-2's dynamic draft tree (Li et al. 2024, §4): expand the most promising nodes, rerank all.

Every node carries the cumulative log-probability of its path under the draft model, an
estimate of the chance that the target accepts the whole path. Each expansion step scores the
`topk` frontier nodes' children; all topk × topk children join the candidate pool and the best
`topk` of them (by cumulative score) become the next frontier. After the last step the best
`nodes` candidates form the tree the target verifies. A child's score never exceeds its
parent's (log-probabilities are <= 0; ties are broken towards shallower nodes), so the best
`nodes` always include each chosen node's ancestors.

Pure bookkeeping over token indices and scores: no model, no cache. The drafter feeds the
frontier and hands back each frontier node's log-probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specpilot.config import require


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
        for row, parent in enumerate(parents):
            depth = 1 if parent < 0 else self.depths[parent] + 1
            for col in range(k):
                self.tokens.append(int(top.indices[row, col]))
                self.parents.append(parent)
                self.scores.append(float(cumulative[row * k + col]))
                self.depths.append(depth)
        best = torch.sort(-cumulative, stable=True).indices[: self.topk]
        self.frontier = [first + int(i) for i in best]

    def best(self) -> int:
        """The frontier node most likely to be accepted (highest cumulative score)."""
        return self.frontier[0]

    def select(self) -> tuple[list[int], tuple[int, ...]]:
        """The best `nodes` candidates as (tokens, parents): the best path first (the chain a
        chain drafter would have proposed), then the rest by score; parents precede children."""
        ranked = sorted(
            range(len(self.tokens)), key=lambda i: (-self.scores[i], self.depths[i], i)
        )[: self.nodes]
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
