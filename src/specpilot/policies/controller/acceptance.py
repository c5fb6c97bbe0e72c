"""Acceptance estimates the controller forecasts from (docs/methods.md §7.3): per position, by
confidence, and the batch-wide set whose forecasts every row's rest on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from specpilot.config import require
from specpilot.types import StepRecord

if TYPE_CHECKING:
    from specpilot.policies.controller.row_policy import GoodputPolicy

PRIOR_ACCEPTANCE = 0.5
"""Acceptance assumed for a position nothing has been learned about yet."""

FINISH_POOLING = 8.0
"""Pseudo-steps of the batch-wide acceptance in each row's forecast when planning to finish a
batch soonest; also how uncertain a row's acceptance is before its own steps (finishing.py)."""

LONG_RUN_MEMORY = 0.998
"""Memory per verified row of the long-run batch-wide acceptance."""

IDLE_MEMORY = 0.9
"""What the recent batch-wide acceptance keeps of its counts per step where no row drafts."""

TARGET_CALIBRATION_STRENGTH = 8.0
"""Pseudo-counts of the first position's forecast in each bin of the target-confidence
calibration."""


class AcceptanceByPosition:
    """Exponentially weighted acceptance of each draft position: a_i = P(accept i | accepted
    1..i−1), counted over the steps that verified position i (positions after the first
    rejection were not tested and count for nothing). Each update first multiplies the old
    counts by `memory`, so a row that stops drafting drifts back to its prior."""

    def __init__(self, memory: float) -> None:
        require(0.0 <= memory < 1.0, f"acceptance memory must be in [0, 1), got {memory}")
        self.memory = memory
        self.accepted: list[float] = []
        self.tested: list[float] = []

    def tested_at(self, index: int) -> float:
        """Weighted count of steps that verified position index + 1."""
        return self.tested[index] if index < len(self.tested) else 0.0

    def fade(self, factor: float) -> None:
        """Keep `factor` of every count: older evidence weighs less against the prior."""
        self.accepted = [x * factor for x in self.accepted]
        self.tested = [x * factor for x in self.tested]

    def add(self, verified: int, accepted: int) -> None:
        self.fade(self.memory)
        for i in range(min(verified, accepted + 1)):
            if i == len(self.tested):
                self.accepted.append(0.0)
                self.tested.append(0.0)
            self.tested[i] += 1.0
            self.accepted[i] += float(i < accepted)

    def estimates(self, length: int, prior: Sequence[float] | None, strength: float) -> list[float]:
        """a_1..a_length, each shrunk towards its prior with `strength` pseudo-steps; without a
        prior list, towards the estimate of the position before (the first: PRIOR_ACCEPTANCE)."""
        out: list[float] = []
        for i in range(length):
            base = prior[i] if prior is not None else (out[-1] if out else PRIOR_ACCEPTANCE)
            seen = self.tested[i] if i < len(self.tested) else 0.0
            hits = self.accepted[i] if i < len(self.accepted) else 0.0
            out.append((hits + strength * base) / (seen + strength))
        return out


class ConfidenceCalibration:
    """Acceptance as a function of a confidence (the draft's or the target's top probability at
    temperature 1) in `bins` equal bins over [0, 1], exponentially weighted over all rows, each
    bin shrunk towards the position forecast with `strength` pseudo-counts."""

    def __init__(self, bins: int = 10, memory: float = 0.995, strength: float = 2.0) -> None:
        self.bins, self.memory, self.strength = bins, memory, strength
        self.accepted = [0.0] * bins
        self.tested = [0.0] * bins

    def _bin(self, confidence: float) -> int:
        return min(int(confidence * self.bins), self.bins - 1)

    def add(self, confidence: float, accepted: bool) -> None:
        self.accepted = [x * self.memory for x in self.accepted]
        self.tested = [x * self.memory for x in self.tested]
        b = self._bin(confidence)
        self.tested[b] += 1.0
        self.accepted[b] += float(accepted)

    def _in_bin(self, b: int, prior: float) -> float:
        return (self.accepted[b] + self.strength * prior) / (self.tested[b] + self.strength)

    def acceptance(self, confidence: float, prior: float) -> float:
        return self._in_bin(self._bin(confidence), prior)

    def highest(self, prior: float) -> float:
        """The most any confidence can make of `prior`: the best bin's acceptance."""
        return max(self._in_bin(b, prior) for b in range(self.bins))


class BatchAcceptance:
    """The batch-wide estimates, learned from every row that drafted, and the forecasts of each
    row built on them.

    Two estimates of a_i: a recent one (`memory` per row that drafted) shrunk towards a long-run
    one (LONG_RUN_MEMORY); on a step where no row drafts the recent one fades (IDLE_MEMORY)
    without learning, so a stale spell of rejections drifts back to the long-run level instead
    of waiting for one-token probes to outweigh it. Openings: a request's first step drafts the
    answer's first token, which a draft model predicts far worse than the rest, so first steps
    are learned apart (`opening`) and teach neither the batch-wide estimate nor the row's own.
    The first position is refined by the row's running target confidence (`row_prior`): easy
    text for the target is easy for the draft."""

    def __init__(self, memory: float, strength: float) -> None:
        self.strength = strength
        self.recent = AcceptanceByPosition(memory)
        self.long_run = AcceptanceByPosition(LONG_RUN_MEMORY)
        self.opening = AcceptanceByPosition(LONG_RUN_MEMORY)
        """Acceptance at requests' first steps."""
        self.calibration = ConfidenceCalibration(strength=strength)
        """Acceptance by the draft's confidence, which rows' policies stop drafting on."""
        self.target_calibration = ConfidenceCalibration(strength=TARGET_CALIBRATION_STRENGTH)
        """First-position acceptance by the row's running target confidence (`row_prior`)."""
        self.opening_rows: list[bool] = []
        """Which rows of the step planned last were at their request's first step."""
        self.planned_confidence: list[float | None] = []
        """Each row's running target confidence when the step planned last was planned."""

    def forecasts(
        self,
        policies: Sequence[GoodputPolicy],
        caps: Sequence[int],
        finish: bool,
        most_confident: bool = False,
    ) -> list[list[float]]:
        """Each row's a_1..a_cap: the opening estimate at its request's first step, else its own
        shrunk towards the batch-wide one (`row_prior`; as if the row showed the confidence the
        calibration rates highest, if `most_confident`), with FINISH_POOLING pseudo-steps when
        plans finish a batch."""
        depth = max(caps)
        long_run = self.long_run.estimates(depth, None, self.strength)
        prior = self.recent.estimates(depth, long_run, self.strength)
        opening = self.opening.estimates(depth, long_run, self.strength)
        pooling = FINISH_POOLING if finish else None
        return [
            (
                opening
                if policy.opening
                else policy.forecast(self.row_prior(prior, policy, most_confident), pooling)
            )[:cap]
            for policy, cap in zip(policies, caps, strict=True)
        ]

    def row_prior(
        self, prior: list[float], policy: GoodputPolicy, most_confident: bool = False
    ) -> list[float]:
        """The batch-wide a_i with a_1 refined by the row's running target confidence, which the
        target's own steps give before the row drafts (one batch-wide estimate cannot tell a
        batch of easy prompts from a hard one)."""
        if most_confident and prior:
            return [self.target_calibration.highest(prior[0]), *prior[1:]]
        if policy.target_confidence is None or not prior:
            return prior
        first = self.target_calibration.acceptance(policy.target_confidence, prior[0])
        return [first, *prior[1:]]

    def counted_in(self, policy: GoodputPolicy) -> AcceptanceByPosition:
        """The estimate a row's forecast rests on: the opening one at its request's first step,
        else its own."""
        return self.opening if policy.opening else policy.acceptance

    def note_plan(self, policies: Sequence[GoodputPolicy]) -> None:
        """Which rows open their request and their target confidence, as planned (`learn`)."""
        self.opening_rows = [policy.opening for policy in policies]
        self.planned_confidence = [policy.target_confidence for policy in policies]

    def learn(self, records: Sequence[StepRecord]) -> None:
        """One step's outcomes, row by row as planned (`note_plan`)."""
        learned = False
        rows = zip(records, self.opening_rows, self.planned_confidence, strict=True)
        for record, opening, confidence in rows:
            if not record.num_verified:  # a row that drafted nothing says nothing of the drafter
                continue
            if opening:
                self.opening.add(record.num_verified, record.num_accepted)
                continue
            if confidence is not None:
                self.target_calibration.add(confidence, record.num_accepted > 0)
            self.recent.add(record.num_verified, record.num_accepted)
            self.long_run.add(record.num_verified, record.num_accepted)
            learned = True
        if not learned:  # an idle step: the recent estimate fades towards the long run
            self.recent.fade(IDLE_MEMORY)
