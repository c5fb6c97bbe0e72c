"""Exact tree verification in llama.cpp's KV cache, with temporary sequence ids.

A draft tree's node must see the committed prefix, its ancestors and itself, and nothing else.
llama.cpp masks attention by sequence id (a query sees the cells of its first sequence id, up
to its own position), and a cell may belong to several sequences. So each root-to-leaf path gets
a temporary id: the committed prefix is copied into every leaf's id (`seq_cp` only tags cells,
it copies no data), and a node's cell carries the ids of the leaves below it. A node's first id
is one of its leaves, whose cells are exactly the prefix and that leaf's path; positions (the
node's depth) hide the path's deeper nodes. The keys, values and logits are those of the node's
branch fed alone as a chain.

After verification `keep` tags the accepted path's cells with the slot's own id (they already
sit at the positions a chain would have put them) and `release` drops the temporary ids, which
frees every other node's cell.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.tree import tree_depths


@dataclass(frozen=True)
class TreeSeqs:
    """One fed tree: its leaves' temporary ids and each node's sequence ids."""

    start: int
    """Cache position of the root (the last committed token)."""
    leaf_ids: tuple[int, ...]
    node_seqs: tuple[tuple[int, ...], ...]
    depths: tuple[int, ...]


def leaves(parents: tuple[int, ...]) -> list[int]:
    """The nodes with no children."""
    parented = set(parents)
    return [i for i in range(len(parents)) if i not in parented]


def plan(parents: tuple[int, ...], start: int, free_ids: list[int]) -> TreeSeqs:
    """Give each leaf of the tree an id from `free_ids` (taken from its front; the caller
    checked there are enough)."""
    depths = tree_depths(parents)
    ids = {leaf: free_ids.pop(0) for leaf in leaves(parents)}
    below: list[list[int]] = [[] for _ in parents]
    for i in reversed(range(len(parents))):
        if i in ids:
            below[i].insert(0, ids[i])
        if parents[i] >= 0:
            below[parents[i]][:0] = below[i]
    return TreeSeqs(start, tuple(ids.values()), tuple(map(tuple, below)), tuple(depths))


def keep(llama, memory, slot: int, tree: TreeSeqs, path: tuple[int, ...]) -> None:
    """Tag the accepted nodes `path` (a root-to-node chain) with the slot's sequence id."""
    if path:
        leaf = tree.node_seqs[path[-1]][0]  # any leaf below the last accepted node
        llama.llama_memory_seq_cp(memory, leaf, slot, tree.start + 1, tree.start + 1 + len(path))


def release(llama, memory, tree: TreeSeqs) -> list[int]:
    """Drop the tree's temporary ids (cells no other sequence holds become free); return them."""
    for seq in tree.leaf_ids:
        llama.llama_memory_seq_rm(memory, seq, -1, -1)
    return list(tree.leaf_ids)
