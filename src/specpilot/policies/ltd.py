"""LTD (Learning to Draft): two small learned policies shape each dynamic draft tree.

After each tree level the depth policy decides CONTINUE or STOP from the cumulative scores of
the latest expansion (W² values), the context length L and the levels D drafted so far; once
growing stops, the size policy picks how many candidates V the target verifies from every score
in the tree, L and D. Both are argmax over a ReLU MLP trained with PPO on the throughput of
draft–verify cycles (`specpilot train-ltd`). Decisions read only draft scores of the committed
prefix, and any top-V set holds each node's ancestors, so decoding stays lossless.

Observation layout (docs/methods.md, "LTD"): as the authors' code, L / 1000 and D / 10 each
repeated (14× for depth, 29× for size) after the scores, zero-padded to a fixed width; but L is
the true sequence length (their inference code passes a constant) and D counts tree levels.
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from specpilot.config import require
from specpilot.policies.base import DraftToken
from specpilot.policies.ltd_net import DEPTH_REPEATS, SIZE_REPEATS, LtdNets, LtdShape
from specpilot.types import StepRecord

USES = ("both", "depth", "size")
"""Which of a folder's policies decide (the other choice falls back to the drafter's own
depth or node count): for the paper's ablations."""


def depth_observation(latest: np.ndarray, context_len: int, depth: int, shape: LtdShape):
    """[W² + 28] float32: the latest expansion's cumulative scores, L / 1000, D / 10."""
    obs = np.zeros(shape.depth_features, dtype=np.float32)
    n = min(len(latest), shape.topk * shape.topk)
    obs[:n] = latest[:n]
    start = shape.topk * shape.topk
    obs[start : start + DEPTH_REPEATS] = context_len / 1000
    obs[start + DEPTH_REPEATS :] = depth / 10
    return obs


def size_observation(scores: np.ndarray, context_len: int, depth: int, shape: LtdShape):
    """[W + (max_depth − 1)·W² + 58] float32: every candidate's cumulative score in the order
    the tree generated them, L / 1000, D / 10."""
    obs = np.zeros(shape.size_features, dtype=np.float32)
    width = shape.candidates(shape.max_depth)
    n = min(len(scores), width)
    obs[:n] = scores[:n]
    obs[width : width + SIZE_REPEATS] = context_len / 1000
    obs[width + SIZE_REPEATS :] = depth / 10
    return obs


@contextmanager
def single_thread():
    """Run torch on one CPU thread inside the block. For matrices as small as the policies' the
    intra-op thread handoff costs more than the work, and on a busy machine the waiting threads
    made one decision take ~16 ms instead of ~0.02 ms, and a PPO update never end (measured on
    2 shared cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def argmax(net: torch.nn.Module, obs: np.ndarray) -> int:
    """The net's most likely action (one thread, see `single_thread`)."""
    with single_thread(), torch.inference_mode():
        return int(net(torch.from_numpy(obs)).argmax())


@dataclass
class LtdPolicy:
    """A DraftPolicy for tree drafters plus the TreePolicy hooks (`continue_tree`,
    `tree_size`). `check_every`: consult the depth policy only every n levels (the authors'
    inference code uses 3; 1, the default, is how it is trained)."""

    nets: LtdNets
    use: str = "both"
    check_every: int = 1
    seconds: float = field(default=0.0, init=False)
    """The policies' own time since the last step record (reported as StepRecord.policy_s)."""

    def __post_init__(self) -> None:
        require(self.use in USES, f"ltd use must be one of {', '.join(USES)}, got {self.use!r}")
        require(self.check_every >= 1, f"ltd check_every must be >= 1, got {self.check_every}")
        for name in ("depth", "size"):
            require(
                self.use not in ("both", name) or getattr(self.nets, name) is not None,
                f"the LTD policy folder has no {name} policy; use={self._other(name)} uses the "
                "other one alone",
            )

    @staticmethod
    def _other(name: str) -> str:
        return "size" if name == "depth" else "depth"

    @property
    def shape(self) -> LtdShape:
        return self.nets.shape

    @property
    def decides_depth(self) -> bool:
        return self.use in ("both", "depth")

    @property
    def decides_size(self) -> bool:
        return self.use in ("both", "size")

    def __deepcopy__(self, memo):
        """Rows share the (read-only) networks; only the timer is per row."""
        clone = copy.copy(self)
        clone.seconds = 0.0
        return clone

    def drafter_options(self, drafter: str, given: dict) -> dict:
        """The tree drafter options this policy needs: its frontier width (the observations
        have W² scores) and, for the eagle drafter when it decides depth, room to grow to its
        max depth (the model drafter's depth is the policy's budget)."""
        require(
            drafter in ("eagle", "model"),
            f"policy 'ltd' shapes dynamic trees: use drafter 'eagle' (or 'model'), not {drafter!r}",
            ("policy", "drafter"),
        )
        topk = given.get("tree_topk")
        require(
            topk is None or int(topk) == self.shape.topk,
            f"these LTD policies were trained on trees of top-k {self.shape.topk}, not {topk}; "
            "drop tree_topk or train policies for it",
            ("tree_topk",),
        )
        options = {"tree_topk": self.shape.topk}
        if self.decides_depth and drafter == "eagle":
            options["tree_depth"] = self.shape.max_depth
        return {**options, **given}

    # -- DraftPolicy ----------------------------------------------------------------------------
    def reset(self) -> None:
        self.seconds = 0.0

    def draft_budget(self) -> int:
        return self.shape.max_depth

    def admits(self, logits: torch.Tensor) -> bool:
        return True

    def continue_drafting(self, drafted: DraftToken) -> bool:
        return True

    def observe(self, record: StepRecord) -> None:
        pass

    def take_seconds(self) -> float:
        """The policies' time since the last call (the engine puts it in the step record)."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    # -- TreePolicy -----------------------------------------------------------------------------
    def continue_tree(self, tree, context_len: int) -> bool:
        """After a level: grow another one? (`tree` a drafting.dynamic_tree.DynamicTree.)"""
        depth = tree.levels
        if not self.decides_depth or depth % self.check_every:
            return True
        start = time.perf_counter()
        latest = np.asarray(tree.scores[tree.level_starts[-1] :])
        obs = depth_observation(latest, context_len, depth, self.shape)
        decision = argmax(self.nets.depth, obs) == 1
        self.seconds += time.perf_counter() - start
        return decision

    def tree_size(self, tree, context_len: int) -> int | None:
        """How many candidates to verify (None: the drafter's own node count)."""
        if not self.decides_size:
            return None
        start = time.perf_counter()
        obs = size_observation(np.asarray(tree.scores), context_len, tree.levels, self.shape)
        size = self.shape.size_of(argmax(self.nets.size, obs))
        self.seconds += time.perf_counter() - start
        return size
