"""One request's speculation statistics, as the server reports them: in each response's
`usage.speculative_decoding` and in Prometheus counters named exactly like vLLM v1's
(`vllm:spec_decode_*`, vllm/v1/spec_decode/metrics.py), so dashboards and PromQL written for
vLLM read a specpilot server unchanged:

    acceptance rate         rate(vllm:spec_decode_num_accepted_tokens_total[5m])
                              / rate(vllm:spec_decode_num_draft_tokens_total[5m])
    mean acceptance length  1 + rate(vllm:spec_decode_num_accepted_tokens_total[5m])
                              / rate(vllm:spec_decode_num_drafts_total[5m])

As in vLLM, a draft is a verify step that checked at least one drafted token (the goodput
controller may decide to draft nothing in a step: that step is a plain decoding step, not a
draft), a tree counts its depth (the accepted path), and position i counts the drafts whose
(i + 1)-th drafted token was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from specpilot.engine import GenerationStats

ENGINE = "0"
"""vLLM's `engine` label: the index of the engine core; a specpilot server has one."""


@dataclass(frozen=True)
class SpecStats:
    verify_steps: int
    """Target forwards after the prefill, drafts or not."""
    num_drafts: int
    num_draft_tokens: int
    """Drafted tokens the target verified (depth, as vLLM counts)."""
    num_accepted_tokens: int
    new_tokens: int
    acceptance_histogram: tuple[int, ...]
    """Drafts by the number of drafted tokens they accepted (index 0: none)."""
    accepted_per_position: tuple[int, ...]

    @classmethod
    def of(cls, stats: GenerationStats) -> SpecStats:
        drafts = [record for record in stats.records if record.num_verified > 0]
        histogram = [0] * (max((r.num_accepted for r in drafts), default=-1) + 1)
        for record in drafts:
            histogram[record.num_accepted] += 1
        return cls(
            verify_steps=stats.steps,
            num_drafts=len(drafts),
            num_draft_tokens=stats.verified,
            num_accepted_tokens=stats.accepted,
            new_tokens=stats.new_tokens,
            acceptance_histogram=tuple(histogram),
            accepted_per_position=tuple(stats.accepted_per_position),
        )

    def usage(self) -> dict:
        """`usage.speculative_decoding`: the per-request names serving stacks use
        (num_spec_steps, num_draft_tokens, num_accepted_draft_tokens, draft_acceptance_rate,
        mean_acceptance_length = 1 + accepted / drafts, acceptance_histogram), plus ours:
        verify_steps (drafts or not), mean_accepted_tokens (MAT = tokens / verify steps, the
        number the bench reports) and accepted_per_position."""
        drafts, accepted = self.num_drafts, self.num_accepted_tokens
        return {
            "num_spec_steps": drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_draft_tokens": accepted,
            "draft_acceptance_rate": accepted / self.num_draft_tokens
            if self.num_draft_tokens
            else None,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
            "acceptance_histogram": list(self.acceptance_histogram),
            "verify_steps": self.verify_steps,
            "mean_accepted_tokens": self.new_tokens / self.verify_steps
            if self.verify_steps
            else None,
            "accepted_per_position": list(self.accepted_per_position),
        }


class SpecDecodeCounters:
    """vLLM v1's four spec-decode counters (prometheus_client adds `_total` on exposition),
    with its labels: model_name and engine, plus position for the per-position one."""

    def __init__(self, registry: CollectorRegistry, model_name: str):
        labels = ["model_name", "engine"]
        values = (model_name, ENGINE)
        self.drafts = Counter(
            "vllm:spec_decode_num_drafts",
            "Number of spec decoding drafts.",
            labels,
            registry=registry,
        ).labels(*values)
        self.draft_tokens = Counter(
            "vllm:spec_decode_num_draft_tokens",
            "Number of draft tokens.",
            labels,
            registry=registry,
        ).labels(*values)
        self.accepted_tokens = Counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens.",
            labels,
            registry=registry,
        ).labels(*values)
        self._per_position = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [*labels, "position"],
            registry=registry,
        )
        self._values = values

    def observe(self, stats: SpecStats) -> None:
        self.drafts.inc(stats.num_drafts)
        self.draft_tokens.inc(stats.num_draft_tokens)
        self.accepted_tokens.inc(stats.num_accepted_tokens)
        for position, count in enumerate(stats.accepted_per_position):
            self._per_position.labels(*self._values, str(position)).inc(count)
