"""The default verify policy: the target checks every drafted token."""

from __future__ import annotations

from specpilot.types import Proposal, StepRecord


class VerifyAll:
    def reset(self) -> None:
        pass

    def select(self, sequences, proposals: list[Proposal], slots, samplings) -> list[int]:
        return [proposal.k for proposal in proposals]

    def observe(self, record: StepRecord) -> None:
        pass
