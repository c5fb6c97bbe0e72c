"""Draft trees given by parent indices: what the target must attend to and where each node sits.

Node i of a tree (parents[i] < i, −1 for the root) is fed after the root, the last committed
token, so the verifier's input is [root, node 0, node 1, ...]. Each node attends to the root,
its ancestors and itself, and takes the rotary position of its depth: the same keys, values and
logits as if its branch alone had been fed as a chain.
"""

from __future__ import annotations

import torch

DEFAULT_DEPTH, DEFAULT_TOPK, DEFAULT_NODES = 3, 4, 8
"""Tree defaults from the measured sweeps with trained heads (BENCHMARKS §8.3, §8.7): on both
targets the head's own tokens past the first level are accepted too rarely to pay for deeper or
wider trees (1.5B: 3 levels × top 4 × 8 nodes 1.70× plain decoding, 4 × 8 × 16 1.63×,
6 × 10 × 32 1.35×; SmolLM2-135M: 1.18× against 1.07× and less)."""


def tree_depths(parents: tuple[int, ...] | list[int]) -> list[int]:
    """Depth of each node below the root (the root's children have depth 1)."""
    depths: list[int] = []
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"tree node {i} has parent {parent}; parents must precede children")
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def tree_mask(parents: tuple[int, ...] | list[int]) -> torch.Tensor:
    """[n + 1, n + 1] bool, row/column 0 the root: True where a position may attend."""
    n = len(parents)
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:, 0] = True
    mask[0, 0] = True
    for i, parent in enumerate(parents):
        mask[i + 1] = mask[parent + 1]
        mask[i + 1, i + 1] = True
    return mask


def children(parents: tuple[int, ...] | list[int]) -> list[list[int]]:
    """children[j]: the nodes whose parent is row j of the verifier's input (0 the root, i + 1
    node i), in proposal order."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, parent in enumerate(parents):
        kids[parent + 1].append(i)
    return kids


def graft(
    tokens: list[int], parents: tuple[int, ...] | list[int], branch: list[int]
) -> tuple[list[int], tuple[int, ...]]:
    """The tree with the chain `branch` hung from the root: where a node on its way already
    holds the branch's next token the branch follows it, and only the rest is added, after the
    existing nodes (so parents still precede children and no node gets two alike children)."""
    tokens, parents = list(tokens), list(parents)
    node = -1
    for token in branch:
        kids = (i for i, parent in enumerate(parents) if parent == node)
        child = next((i for i in kids if tokens[i] == token), None)
        if child is None:
            tokens.append(token)
            parents.append(node)
            child = len(tokens) - 1
        node = child
    return tokens, tuple(parents)
