"""Per-request statistics aggregated from per-step records (vocabulary: README, "Vocabulary").

Drafted, verified and accepted counts are depths (StepRecord), so acceptance rates and
acceptance by position mean the same for chains and trees; `nodes` is the verify cost."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specpilot.types import StepRecord


@dataclass
class GenerationStats:
    new_tokens: int = 0
    steps: int = 0
    """Target verify forwards (the prefill is not a step)."""
    drafted: int = 0
    verified: int = 0
    accepted: int = 0
    nodes: int = 0
    """Drafted tokens the target verified, tree siblings included."""
    draft_s: float = 0.0
    policy_s: float = 0.0
    """Of draft_s, the time a learned draft policy spent deciding (LTD)."""
    verify_s: float = 0.0
    prefill_s: float = 0.0
    prefill_tokens: int = 0
    """Prompt tokens fed before the first step: all but the last, less the prefix its cache
    slot already held (prefix reuse)."""
    total_s: float = 0.0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    records: list[StepRecord] = field(default_factory=list)

    def add(self, record: StepRecord) -> None:
        self.records.append(record)
        self.steps += 1
        self.new_tokens += record.num_emitted
        self.drafted += record.num_drafted
        self.verified += record.num_verified
        self.accepted += record.num_accepted
        self.nodes += record.num_nodes
        self.draft_s += record.draft_s
        self.policy_s += record.policy_s
        self.verify_s += record.verify_s
        grow = record.num_verified - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position.extend([0] * grow)
            self.accepted_per_position.extend([0] * grow)
        for i in range(record.num_verified):
            self.drafted_per_position[i] += 1
            self.accepted_per_position[i] += int(i < record.num_accepted)

    @classmethod
    def combined(cls, parts: list[GenerationStats]) -> GenerationStats:
        """Totals over several generations (e.g. the turns of one conversation)."""
        total = cls()
        for part in parts:
            for record in part.records:
                total.add(record)
            total.prefill_s += part.prefill_s
            total.prefill_tokens += part.prefill_tokens
            total.total_s += part.total_s
        return total

    @property
    def mean_accepted_tokens(self) -> float:
        """MAT (Spec-Bench): tokens emitted per verify step, = 1 + accepted / steps."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / verified draft depth."""
        return self.accepted / self.verified if self.verified else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def other_s(self) -> float:
        return max(0.0, self.total_s - self.draft_s - self.verify_s - self.prefill_s)

    @property
    def acceptance_by_position(self) -> list[float]:
        """Probability that draft depth i + 1 is accepted, given that it was verified."""
        return [
            a / d if d else 0.0
            for a, d in zip(self.accepted_per_position, self.drafted_per_position, strict=False)
        ]

    def summary(self) -> dict:
        """JSON-friendly numbers (no per-step records)."""
        data = {k: v for k, v in asdict(self).items() if k != "records"}
        data.update(
            mean_accepted_tokens=self.mean_accepted_tokens,
            acceptance_rate=self.acceptance_rate,
            tokens_per_s=self.tokens_per_s,
            other_s=self.other_s,
            acceptance_by_position=self.acceptance_by_position,
        )
        return data
