"""A row's draft policy under the goodput controller (docs/methods.md §7.3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specpilot.config import require
from specpilot.policies.base import DraftToken
from specpilot.policies.controller.acceptance import (
    PRIOR_ACCEPTANCE,
    AcceptanceByPosition,
    ConfidenceCalibration,
)
from specpilot.sampling import top_probability
from specpilot.types import StepRecord

TARGET_CONFIDENCE_MEMORY = 0.75
"""What a row's running target confidence keeps per step."""


@dataclass
class GoodputPolicy:
    """Drafts up to the budget the controller gives it (at most `max_k`) and keeps the row's own
    acceptance by position (`memory` per step, `strength` pseudo-steps of the batch-wide
    estimate as its prior). Both are long: a request's text sets its level, but a rejection
    does not predict the next, so a row that stopped at its first rejections would lose to a
    constant draft length.

    Drafter confidence: before drawing each token from draft logits, the acceptance it forecasts
    is refined by the draft's confidence there (ConfidenceCalibration), and drafting stops when
    the position's expected gain (the chance of reaching it times that acceptance) falls below
    what the controller says a verified position must bring (`prepare`). Decided from the
    distribution before its token is drawn: lossless (docs/methods.md §1.2)."""

    max_k: int = 8
    memory: float = 0.95
    strength: float = 8.0
    acceptance: AcceptanceByPosition = field(init=False, repr=False)
    drafted_ever: bool = field(default=False, init=False, repr=False)
    """Whether this request has drafted yet (if not, its drafter has the whole prompt to read)."""
    opening: bool = field(default=True, init=False, repr=False)
    """Whether the row's next step is its request's first, whose first draft token is the
    answer's first token: forecast from the controller's opening estimate, not the row's own."""
    spell: int = field(default=0, init=False, repr=False)
    """Steps this row has drafted in a row, up to its last (0: it did not draft on it)."""
    drafted_steps: int = field(default=0, init=False, repr=False)
    """Steps this request has drafted on, over all its spells."""
    planned: bool = field(default=False, init=False, repr=False)
    """Whether a plan, not only probes, has had this request draft (`CatchUp.start_horizon`)."""
    probe_started: bool = field(default=False, init=False, repr=False)
    """Whether this request's first drafting step was a probe (`Exploration.repaid`)."""
    target_confidence: float | None = field(default=None, init=False, repr=False)
    """The target's top probability at this row's recent steps (TARGET_CONFIDENCE_MEMORY per
    step; None before any): what forecasts a row's acceptance before it drafts."""

    @property
    def drafted_last(self) -> bool:
        """Whether the controller let this row draft on its last step (its drafter is caught up)."""
        return self.spell > 0

    def __post_init__(self) -> None:
        require(1 <= self.max_k <= 64, f"goodput max_k must be in 1..64, got {self.max_k}")
        require(self.strength > 0, f"goodput strength must be > 0, got {self.strength}")
        self.reset()

    def reset(self) -> None:
        self.acceptance = AcceptanceByPosition(self.memory)
        self.spell = self.drafted_steps = 0
        self.drafted_ever = self.planned = self.probe_started = False
        self.target_confidence = None
        self.opening = True
        self.prepare([], 0.0, None)

    def prepare(
        self, forecast: Sequence[float], stop_gain: float, calibration: ConfidenceCalibration | None
    ) -> None:
        """Set by the controller before the row drafts: its forecast a_i for this step, the
        least expected gain a drafted position must bring, and the batch-wide calibration."""
        self.step_forecast = list(forecast)
        self.stop_gain = stop_gain
        self.calibration = calibration
        self.reach = 1.0
        self.confidences: list[float] = []

    def note_budget(self, budget: int, probing: bool) -> None:
        """The controller gave this row `budget` now (`probing`: as a probe, not a plan)."""
        self.spell = self.spell + 1 if budget else 0
        self.drafted_steps += budget > 0
        self.probe_started = self.probe_started or (
            budget > 0 and probing and not self.drafted_ever
        )
        self.drafted_ever = self.drafted_ever or budget > 0
        self.planned = self.planned or (budget > 0 and not probing)

    def draft_budget(self) -> int:
        return self.max_k

    def admits(self, logits: torch.Tensor | None) -> bool:
        if self.calibration is None or logits is None:
            return True
        i = len(self.confidences)
        forecast = self.step_forecast or [PRIOR_ACCEPTANCE]
        confidence = top_probability(logits)
        accept = self.calibration.acceptance(confidence, forecast[min(i, len(forecast) - 1)])
        if self.reach * accept < self.stop_gain:
            return False
        self.confidences.append(confidence)
        self.reach *= accept
        return True

    def continue_drafting(self, drafted: DraftToken) -> bool:
        return True

    def observe(self, record: StepRecord) -> None:
        seen = record.target_confidence
        if seen is None:  # not read: a confidence from steps long past is not this row's now
            self.target_confidence = None
        else:
            old = seen if self.target_confidence is None else self.target_confidence
            self.target_confidence = (
                TARGET_CONFIDENCE_MEMORY * old + (1 - TARGET_CONFIDENCE_MEMORY) * seen
            )
        if not self.opening:  # the answer's first token says little of the rest
            self.acceptance.add(record.num_verified, record.num_accepted)
        self.opening = False
        if self.calibration is not None:
            tested = min(record.num_verified, record.num_accepted + 1, len(self.confidences))
            for i in range(tested):
                self.calibration.add(self.confidences[i], i < record.num_accepted)
        self.confidences = []

    def forecast(self, prior: Sequence[float], strength: float | None = None) -> list[float]:
        """This row's a_i for as many positions as `prior` (the batch-wide a_i) gives, shrunk
        towards it with `strength` pseudo-steps (default: the policy's)."""
        return self.acceptance.estimates(len(prior), prior, strength or self.strength)
