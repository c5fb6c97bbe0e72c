"""Size each draft tree for the machine it runs on: verify the number of candidates that
maximises expected tokens per second on the verify-latency curve measured online
(docs/methods.md §7.8).

The best tree size depends on the CPU more than on anything else: where a forward over 16 tokens
costs ~1.1 forwards over one (bf16 CPUs) the eagle tree's 8 nodes pay, but in float32 on an
AVX2-only CPU 9 tokens cost ~1.5 forwards and the same head's 8-node tree ran at 1.04x plain
decoding where 4 nodes ran at 1.33x and this policy at 1.52x (BENCHMARKS §8.9). So after the
tree is grown, with the candidates ranked by cumulative draft log-probability (any leading
slice is a tree, `DynamicTree.ranking`), the policy verifies the n that maximises

    G(n) = (1 + r · Σ_{i≤n} exp(s_i)) / (T_draft + T_verify(n + 1)),

where exp(s_i) is the draft's probability of the i-th best path (EAGLE-2: draft confidence
tracks acceptance), r calibrates it (accepted path lengths over predicted ones, running), and
T_draft and T_verify are learned from the steps' own timings (policies.latency.LatencyCurve).
The first steps verify a spread of sizes to learn the curve; a re-probe of a neighbouring size
every `probe_every` steps keeps it current as contexts grow.

Lossless: the size depends on the draft's scores and on timings, never on the target's tokens
(docs/methods.md §1.2). What is learned describes the machine, so requests share it (the
engine copies a policy per request). Batch 1: at larger batches a row's timing is the whole
batch's forward, which the per-row sample does not know.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections import deque
from dataclasses import dataclass, field

import torch

from specpilot.config import require
from specpilot.drafting.dynamic_tree import DEFAULT_DEPTH
from specpilot.policies.base import DraftToken
from specpilot.policies.latency import LatencyCurve
from specpilot.types import StepRecord

CALIBRATION_PRIOR = 4.0
"""Pseudo-steps at r = 1 (the draft's confidence taken at its word) before steps count."""


class _Measurements:
    """What the policy learns about the machine and the head, shared by every request's copy."""

    def __init__(self, window: int, memory: float) -> None:
        self.verify = LatencyCurve(window=window)
        self.draft: deque[float] = deque(maxlen=window)
        self.accepted = self.predicted = CALIBRATION_PRIOR
        self.memory = memory
        self.steps = 0

    def calibration(self) -> float:
        return self.accepted / self.predicted

    def learn(self, record: StepRecord, predicted: float | None) -> None:
        self.steps += 1
        self.verify.add(record.num_nodes + 1, record.verify_s)
        self.draft.append(record.draft_s)
        if predicted is not None and predicted > 0:
            self.accepted = self.memory * self.accepted + record.num_accepted
            self.predicted = self.memory * self.predicted + predicted


@dataclass
class TreeGoodputPolicy:
    """Eagle/model trees of `depth` levels, each step verifying the goodput-optimal number of
    the drafter's candidates (at most its `nodes`; at least `min_nodes`)."""

    depth: int = DEFAULT_DEPTH
    min_nodes: int = 1
    probe_every: int = 16
    window: int = 9
    memory: float = 0.98
    measured: _Measurements = field(init=False, repr=False)
    predicted: float | None = field(default=None, init=False, repr=False)
    """Σ exp(s_i) over the candidates verified last, uncalibrated (for `observe`)."""

    def __post_init__(self) -> None:
        require(1 <= self.depth <= 16, f"tree goodput depth must be in 1..16, got {self.depth}")
        require(self.min_nodes >= 1, f"tree goodput min_nodes must be >= 1, got {self.min_nodes}")
        require(self.probe_every >= 2, f"probe_every must be >= 2, got {self.probe_every}")
        require(self.window >= 1, f"tree goodput window must be >= 1, got {self.window}")
        require(0 < self.memory <= 1, f"tree goodput memory must be in (0, 1], got {self.memory}")
        self.measured = _Measurements(self.window, self.memory)

    def __deepcopy__(self, memo):
        """A request's copy shares the measurements (they describe the machine and the head)."""
        clone = copy.copy(self)
        clone.predicted = None
        return clone

    def drafter_options(self, drafter: str, given: dict) -> dict:
        require(
            drafter in ("eagle", "model"),
            f"--policy tree-goodput sizes dynamic trees: use --drafter eagle or model, "
            f"not {drafter!r}",
        )
        if drafter != "eagle":
            return given
        if "depth" in given:  # --tree-depth: the levels drafted, which the budget must not cap
            self.depth = int(given["depth"])
            self.__post_init__()
        return {**given, "depth": self.depth}

    # -- DraftPolicy --------------------------------------------------------------------------
    def reset(self) -> None:
        self.predicted = None

    def draft_budget(self) -> int:
        return self.depth

    def admits(self, logits: torch.Tensor) -> bool:
        return True

    def continue_drafting(self, drafted: DraftToken) -> bool:
        return True

    def observe(self, record: StepRecord) -> None:
        if record.num_nodes > 0:
            self.measured.learn(record, self.predicted)
        self.predicted = None

    # -- TreePolicy ---------------------------------------------------------------------------
    def continue_tree(self, tree, context_len: int) -> bool:
        return True

    def tree_size(self, tree, context_len: int) -> int:
        """The candidates to verify (`tree` a drafting.dynamic_tree.DynamicTree, fully grown)."""
        cap = min(tree.nodes, len(tree.tokens))
        confidence = [math.exp(tree.scores[i]) for i in tree.ranking()[:cap]]
        sizes = self.sizes(cap)
        best = self.best_size(confidence) if self.measured.steps >= len(sizes) else cap
        size = self._probe(sizes, best) or best
        size = max(min(size, cap), min(self.min_nodes, cap))
        self.predicted = sum(confidence[:size])
        return size

    @staticmethod
    def sizes(cap: int) -> list[int]:
        """The sizes the opening sweep measures: 1, 2, 4, ... and `cap`."""
        sizes = [n for n in (1, 2, 4, 8, 16, 32) if n < cap]
        return [*sizes, cap]

    def _probe(self, sizes: list[int], best: int) -> int | None:
        """A size to measure this step, if one is due: each of `sizes` once at the start, then
        every `probe_every` steps a size next to the `best` one (alternately one larger and one
        smaller), so the curve around the choice stays measured as the context grows."""
        steps = self.measured.steps
        if steps < len(sizes):
            return sizes[steps]
        if steps % self.probe_every:
            return None
        return best + 1 if (steps // self.probe_every) % 2 else max(best - 1, 1)

    def best_size(self, confidence: list[float]) -> int:
        """argmax_n G(n) over n = 1..len(confidence) (module docstring)."""
        r = self.measured.calibration()
        draft_s = statistics.median_low(self.measured.draft) if self.measured.draft else 0.0
        best, best_goodput, expected = 1, -1.0, 1.0
        for n, p in enumerate(confidence, start=1):
            expected += min(r * p, 1.0)
            goodput = expected / (draft_s + self.measured.verify(n + 1))
            if goodput > best_goodput:
                best, best_goodput = n, goodput
        return best
