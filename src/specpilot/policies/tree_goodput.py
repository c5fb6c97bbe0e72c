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
from collections import defaultdict, deque
from dataclasses import dataclass, field

import torch

from specpilot.config import require
from specpilot.policies.base import DraftToken
from specpilot.policies.latency import LatencyCurve
from specpilot.tree import DEFAULT_DEPTH
from specpilot.types import StepRecord

CALIBRATION_PRIOR = 4.0
"""Pseudo-steps at r = 1 (the draft's confidence taken at its word) before steps count."""


DEPTH_WINDOW = 64
"""Recent steps whose accepted lengths estimate what each depth would accept."""
OPENING_STEPS = 8
"""Steps at the full depth before the depth adapts (the size sweep runs within them)."""


class _Measurements:
    """What the policy learns about the machine and the head, shared by every request's copy."""

    def __init__(self, window: int, memory: float) -> None:
        self.verify = LatencyCurve(window=window)
        self.draft: dict[int, deque[float]] = defaultdict(lambda: deque(maxlen=window))
        """Draft seconds of recent steps, per depth drafted."""
        self.nodes: dict[int, deque[int]] = defaultdict(lambda: deque(maxlen=window))
        """Candidates verified by recent steps, per depth drafted."""
        self.outcomes: deque[tuple[int, int]] = deque(maxlen=DEPTH_WINDOW)
        """(depth drafted, depth accepted) of recent steps."""
        self.accepted = self.predicted = CALIBRATION_PRIOR
        self.memory = memory
        self.steps = 0

    def calibration(self) -> float:
        return self.accepted / self.predicted

    def learn(self, record: StepRecord, predicted: float | None) -> None:
        self.steps += 1
        self.verify.add(record.num_nodes + 1, record.verify_s)
        self.draft[record.num_drafted].append(record.draft_s)
        self.nodes[record.num_drafted].append(record.num_nodes)
        self.outcomes.append((record.num_drafted, record.num_accepted))
        if predicted is not None and predicted > 0:
            self.accepted = self.memory * self.accepted + record.num_accepted
            self.predicted = self.memory * self.predicted + predicted

    @staticmethod
    def _nearest_median(samples: dict[int, deque], depth: int) -> tuple[int, float] | None:
        """(d, the median of samples[d]) for the drafted depth d nearest `depth` (the deeper on
        a tie), None before any step."""
        drafted = [d for d, values in samples.items() if values]
        if not drafted:
            return None
        nearest = min(drafted, key=lambda d: (abs(d - depth), -d))
        return nearest, statistics.median_low(samples[nearest])

    def draft_time(self, depth: int) -> float:
        """Median draft seconds of a step of `depth` levels; where none was timed, the nearest
        timed depth's, scaled in proportion (0 before any step)."""
        found = self._nearest_median(self.draft, depth)
        return 0.0 if found is None else found[1] * depth / found[0]

    def verified_nodes(self, depth: int) -> int:
        """Median candidates verified at `depth` levels (the nearest timed depth's, else 1)."""
        found = self._nearest_median(self.nodes, depth)
        return 1 if found is None else int(found[1])

    def expected_accepted(self, depth: int) -> float | None:
        """E[min(accepted, depth)] over recent steps that drafted at least `depth` levels (a
        deeper tree holds a shallower one's levels), None if none did."""
        seen = [min(accepted, depth) for drafted, accepted in self.outcomes if drafted >= depth]
        return sum(seen) / len(seen) if seen else None


@dataclass
class TreeGoodputPolicy:
    """Eagle/model trees of `depth` levels, each step verifying the goodput-optimal number of
    the drafter's candidates (at most its `nodes`; at least `min_nodes`)."""

    depth: int = DEFAULT_DEPTH
    """The most levels a step drafts."""
    min_nodes: int = 1
    probe_every: int = 16
    window: int = 9
    memory: float = 0.98
    adapt_depth: bool = True
    """Draft each step the depth whose measured goodput is best (else always `depth`)."""
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
            f"policy 'tree-goodput' sizes dynamic trees: use drafter 'eagle' or 'model', "
            f"not {drafter!r}",
            ("policy", "drafter"),
        )
        if drafter != "eagle":
            return given
        if "tree_depth" in given:  # the levels drafted, which the budget must not cap
            self.depth = int(given["tree_depth"])
            self.__post_init__()
        return {**given, "tree_depth": self.depth}

    # -- DraftPolicy --------------------------------------------------------------------------
    def reset(self) -> None:
        self.predicted = None

    def draft_budget(self) -> int:
        """The levels to draft this step: `depth` during the opening steps and at every
        `probe_every`-th step (half a period after the size re-probes), so the deepest level's
        acceptance stays measured; else the depth d maximising (1 + E[min(accepted, d)]) /
        (T_draft(d) + T_verify(n_d + 1)), with n_d the candidates verified at that depth."""
        measured = self.measured
        probe = measured.steps % self.probe_every == self.probe_every // 2
        if not self.adapt_depth or measured.steps < OPENING_STEPS or probe:
            return self.depth
        best, best_goodput = self.depth, -1.0
        for depth in range(1, self.depth + 1):
            accepted = measured.expected_accepted(depth)
            if accepted is None:
                continue
            seconds = measured.draft_time(depth)
            seconds += measured.verify(measured.verified_nodes(depth) + 1)
            if seconds > 0 and (1 + accepted) / seconds > best_goodput:
                best, best_goodput = depth, (1 + accepted) / seconds
        return best

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
        best = self.best_size(confidence, tree.levels) if self.measured.steps >= len(sizes) else cap
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

    def best_size(self, confidence: list[float], levels: int | None = None) -> int:
        """argmax_n G(n) over n = 1..len(confidence) (module docstring), for a tree of `levels`
        (default `depth`) levels."""
        r = self.measured.calibration()
        draft_s = self.measured.draft_time(levels or self.depth)
        best, best_goodput, expected = 1, -1.0, 1.0
        for n, p in enumerate(confidence, start=1):
            expected += min(r * p, 1.0)
            goodput = expected / (draft_s + self.measured.verify(n + 1))
            if goodput > best_goodput:
                best, best_goodput = n, goodput
        return best
