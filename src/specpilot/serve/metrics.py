"""Prometheus metrics. The spec-decode counters carry vLLM v1's exact names and labels
(serve.spec_stats), so vLLM's spec-decode dashboards read them unchanged; the request metrics
are named after vLLM's with the `specpilot:` prefix.

Each app has its own registry (several servers, e.g. in tests, can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from specpilot.engine import GenerationStats
from specpilot.serve.spec_stats import SpecDecodeCounters, SpecStats

LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
)


class Metrics:
    def __init__(self, running, waiting, model_name: str):
        """`running`, `waiting`: callables giving the batch size and the queue length now;
        `model_name`: the spec-decode counters' label."""
        self.registry = CollectorRegistry()
        r = self.registry
        Gauge(
            "specpilot:num_requests_running", "Requests in the running batch", registry=r
        ).set_function(running)
        Gauge(
            "specpilot:num_requests_waiting", "Requests waiting for a cache slot", registry=r
        ).set_function(waiting)
        self.requests = Counter(
            "specpilot:request_success",
            "Finished requests by finish reason",
            ["finished_reason"],
            registry=r,
        )
        self.rejected = Counter(
            "specpilot:request_rejected",
            "Requests refused (queue full, bad input)",
            ["reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "specpilot:prompt_tokens", "Prompt tokens of admitted requests", registry=r
        )
        self.generation_tokens = Counter(
            "specpilot:generation_tokens", "Generated tokens", registry=r
        )
        self.ttft = Histogram(
            "specpilot:time_to_first_token_seconds",
            "Time to first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "specpilot:time_per_output_token_seconds",
            "Time per output token after the first",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "specpilot:e2e_request_latency_seconds",
            "Request latency, arrival to last token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.spec_decode = SpecDecodeCounters(r, model_name)

    def finished(self, reason: str, prompt_tokens: int, stats: GenerationStats) -> None:
        """Count a finished request (called on the event loop)."""
        self.requests.labels(reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(stats.new_tokens)
        self.spec_decode.observe(SpecStats.of(stats))
