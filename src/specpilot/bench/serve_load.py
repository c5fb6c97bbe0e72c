"""A load generator for an OpenAI-compatible server (`specpilot bench-serve`).

At each concurrency level, that many clients send streamed chat completions back to back until
`requests` have been sent (or the level's time runs out: requests still running are dropped,
and the server cancels them); each request records its time to first token, time per output
token after the first, and the usage the server reports (specpilot's includes speculation
statistics). Loopback only: this is a benchmark of a local server, not a load test of others'.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, replace
from urllib.parse import urlsplit

import httpx
import numpy as np

from specpilot.bench.report import fixed_width_table, machine_info
from specpilot.config import require

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_CONCURRENCY = 1024
MAX_REQUESTS = 100_000
DEFAULT_PROMPTS = (
    "Explain how a hash map works in three sentences.",
    "Write a Python function that checks whether a string is a palindrome.",
    "List five tips for writing clear documentation.",
    "What is the difference between a process and a thread?",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "Write a haiku about autumn rain.",
    "How do I reverse a linked list? Show code.",
    "Give three arguments for and against remote work.",
)


@dataclass(frozen=True)
class LoadSettings:
    url: str
    concurrency: tuple[int, ...] = (1, 4, 16, 64)
    requests: int = 64
    """Requests sent at each concurrency level."""
    max_tokens: int = 128
    temperature: float = 0.0
    timeout_s: float = 600.0
    """Wall-clock limit of each level."""
    model: str | None = None
    """The `model` to ask for (None: the first the server lists)."""

    def __post_init__(self) -> None:
        host = urlsplit(self.url).hostname
        require(
            urlsplit(self.url).scheme == "http" and host in LOOPBACK,
            f"url must be an http:// address on this machine ({', '.join(LOOPBACK)}), "
            f"got {self.url!r}",
            ("url",),
        )
        require(
            self.concurrency and all(1 <= c <= MAX_CONCURRENCY for c in self.concurrency),
            f"concurrency levels must be in 1..{MAX_CONCURRENCY}, got {self.concurrency}",
            ("concurrency",),
        )
        require(
            1 <= self.requests <= MAX_REQUESTS,
            f"requests must be in 1..{MAX_REQUESTS}, got {self.requests}",
            ("requests",),
        )
        require(
            self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}", ("max_tokens",)
        )
        require(
            self.temperature >= 0,
            f"temperature must be >= 0, got {self.temperature}",
            ("temperature",),
        )
        require(self.timeout_s > 0, f"timeout_s must be > 0, got {self.timeout_s}", ("timeout_s",))


@dataclass
class Timing:
    """One request as the client saw it."""

    ok: bool
    total_s: float = 0.0
    ttft_s: float | None = None
    usage: dict | None = None
    error: str | None = None

    @property
    def tokens(self) -> int:
        return (self.usage or {}).get("completion_tokens", 0)

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.tokens < 2:
            return None
        return (self.total_s - self.ttft_s) / (self.tokens - 1)


async def one_request(client: httpx.AsyncClient, body: dict) -> Timing:
    """Send one streamed chat completion and time it."""
    start = time.perf_counter()
    first, usage = None, None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:200]
                return Timing(False, error=f"HTTP {response.status_code}: {text}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return Timing(False, error=str(chunk["error"].get("message")))
                usage = chunk.get("usage") or usage
                deltas = [c.get("delta", {}).get("content") for c in chunk.get("choices", [])]
                if first is None and any(deltas):
                    first = time.perf_counter() - start
    except (httpx.HTTPError, ValueError) as error:
        return Timing(False, error=f"{type(error).__name__}: {error}")
    return Timing(True, time.perf_counter() - start, first, usage)


async def run_level(
    client: httpx.AsyncClient,
    settings: LoadSettings,
    model: str,
    prompts: list[str],
    concurrency: int,
) -> dict:
    """`settings.requests` requests from `concurrency` clients; the level's summary."""
    timings: list[Timing] = []
    sent = 0

    async def user() -> None:
        nonlocal sent
        while sent < settings.requests:
            index = sent
            sent += 1
            body = request_body(settings, model, prompts, index)
            timings.append(await one_request(client, body))

    start = time.perf_counter()
    timed_out = False
    try:
        async with asyncio.timeout(settings.timeout_s):
            await asyncio.gather(*(user() for _ in range(concurrency)))
    except TimeoutError:
        timed_out = True
    return summarize(concurrency, timings, time.perf_counter() - start, timed_out)


def request_body(settings: LoadSettings, model: str, prompts: list[str], index: int) -> dict:
    """The level's request number `index` (0-based): its prompt, in turn, and seed index + 1."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompts[index % len(prompts)]}],
        "max_tokens": settings.max_tokens,
        "temperature": settings.temperature,
        "seed": index + 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def run_level_in_turns(
    clients: list[httpx.AsyncClient],
    settings: LoadSettings,
    models: list[str],
    prompts: list[str],
    concurrency: int,
) -> tuple[list[dict], list[list[float]]]:
    """One level on several servers in turns: each round sends the same `concurrency` requests
    to one server at a time (all at once, waiting for them all), the servers' order rotating
    from round to round; (each server's summary, each round's tokens per second per server).
    A host whose speed drifts slows every server of a round alike, so per-round ratios compare
    servers where whole-level runs, minutes apart, may not."""
    count = len(clients)
    timings: list[list[Timing]] = [[] for _ in clients]
    seconds = [0.0] * count
    rounds: list[list[float]] = []
    timed_out = False
    try:
        async with asyncio.timeout(settings.timeout_s):
            for first in range(0, settings.requests, concurrency):
                indices = range(first, min(first + concurrency, settings.requests))
                turn = len(rounds) % count
                rates = [0.0] * count
                for server in [*range(turn, count), *range(turn)]:
                    start = time.perf_counter()
                    bodies = [request_body(settings, models[server], prompts, i) for i in indices]
                    done = await asyncio.gather(
                        *(one_request(clients[server], body) for body in bodies)
                    )
                    elapsed = time.perf_counter() - start
                    timings[server].extend(done)
                    seconds[server] += elapsed
                    rates[server] = sum(t.tokens for t in done if t.ok) / elapsed
                rounds.append(rates)
    except TimeoutError:
        timed_out = True
    summaries = [summarize(concurrency, timings[s], seconds[s], timed_out) for s in range(count)]
    return summaries, rounds


def paired_ratios(rounds: list[list[float]]) -> list[dict]:
    """Each server after the first against the first, per round: the median ratio of tokens
    per second (rounds where the first produced nothing are left out), and the ratios."""
    paired = []
    for server in range(1, len(rounds[0]) if rounds else 1):
        ratios = [r[server] / r[0] for r in rounds if r[0] > 0]
        median = float(np.median(ratios)) if ratios else None
        paired.append({"server": server, "median_ratio": median, "ratios": ratios})
    return paired


def _percentiles(values: list[float], prefix: str) -> dict:
    points = (50, 90, 99)
    if not values:
        return {f"{prefix}_p{p}_ms": None for p in points}
    found = np.percentile(np.array(values) * 1000, points)
    return {f"{prefix}_p{p}_ms": float(v) for p, v in zip(points, found, strict=True)}


def summarize(concurrency: int, timings: list[Timing], duration_s: float, timed_out: bool) -> dict:
    """Throughput, latency percentiles and acceptance of one level."""
    done = [t for t in timings if t.ok]
    tokens = sum(t.tokens for t in done)
    usage = [(t.usage or {}).get("speculative_decoding") or {} for t in done]
    steps = sum(u.get("verify_steps", 0) for u in usage)
    drafted = sum(u.get("num_draft_tokens", 0) for u in usage)
    accepted = sum(u.get("num_accepted_draft_tokens", 0) for u in usage)
    errors = [t.error for t in timings if not t.ok]
    return {
        "concurrency": concurrency,
        "requests": len(done),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "timed_out": timed_out,
        "duration_s": duration_s,
        "output_tokens": tokens,
        "tokens_per_s": tokens / duration_s if duration_s > 0 else 0.0,
        "requests_per_s": len(done) / duration_s if duration_s > 0 else 0.0,
        **_percentiles([t.ttft_s for t in done if t.ttft_s is not None], "ttft"),
        **_percentiles([t.tpot_s for t in done if t.tpot_s is not None], "tpot"),
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_tokens": tokens / steps if steps else None,
    }


async def run_load_in_turns(
    urls: list[str], settings: LoadSettings, prompts: list[str] | None = None, progress=None
) -> dict:
    """Every concurrency level on every server of `urls`, in turns (run_level_in_turns). The
    report: {"config", "machine", "servers": [{"url", "model", "levels"}], "paired":
    [{"concurrency", "server", "median_ratio", "ratios"}]} (paired: each server's tokens per
    second over the first's, per round). `progress(url, level_summary)` follows each level."""
    checked = [replace(settings, url=url) for url in urls]  # each URL validated
    prompts = list(prompts or DEFAULT_PROMPTS)
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(_client(s)) for s in checked]
        models = [settings.model or await _first_model(client) for client in clients]
        servers = [
            {"url": url, "model": m, "levels": []} for url, m in zip(urls, models, strict=True)
        ]
        paired = []
        for concurrency in settings.concurrency:
            summaries, rounds = await run_level_in_turns(
                clients, settings, models, prompts, concurrency
            )
            for server, summary in zip(servers, summaries, strict=True):
                server["levels"].append(summary)
                if progress is not None:
                    progress(server["url"], summary)
            paired += [{"concurrency": concurrency} | p for p in paired_ratios(rounds)]
    config = asdict(settings) | {"url": list(urls)}
    return {"config": config, "machine": machine_info(), "servers": servers, "paired": paired}


def _client(settings: LoadSettings) -> httpx.AsyncClient:
    """A client of `settings.url` with a connection for each request of the largest level."""
    limits = httpx.Limits(max_connections=max(settings.concurrency))
    return httpx.AsyncClient(
        base_url=settings.url, timeout=httpx.Timeout(settings.timeout_s), limits=limits
    )


async def _first_model(client: httpx.AsyncClient) -> str:
    listed = (await client.get("/v1/models")).raise_for_status().json()
    return listed["data"][0]["id"]


async def run_load(settings: LoadSettings, prompts: list[str] | None = None, progress=None):
    """Every concurrency level in turn; the report ({"config", "machine", "model", "levels"};
    the machine is the client's, which is the server's: the URL is loopback only).
    `progress(level_summary)` is called after each level."""
    prompts = list(prompts or DEFAULT_PROMPTS)
    async with _client(settings) as client:
        model = settings.model or await _first_model(client)
        levels = []
        for concurrency in settings.concurrency:
            levels.append(await run_level(client, settings, model, prompts, concurrency))
            if progress is not None:
                progress(levels[-1])
    return {"config": asdict(settings), "machine": machine_info(), "model": model, "levels": levels}


COLUMNS = [  # (header, key, width, format)
    ("conc", "concurrency", 5, "d"),
    ("ok", "requests", 5, "d"),
    ("err", "errors", 4, "d"),
    ("tok/s", "tokens_per_s", 8, ".1f"),
    ("req/s", "requests_per_s", 7, ".2f"),
    ("TTFT p50", "ttft_p50_ms", 9, ".0f"),
    ("TTFT p99", "ttft_p99_ms", 9, ".0f"),
    ("TPOT p50", "tpot_p50_ms", 9, ".1f"),
    ("TPOT p99", "tpot_p99_ms", 9, ".1f"),
    ("acc", "acceptance_rate", 5, ".2f"),
    ("MAT", "mean_accepted_tokens", 5, ".2f"),
]


def load_table(levels: list[dict]) -> str:
    """Fixed-width text table of the levels (latencies in ms; '-' where nothing was measured)."""
    return fixed_width_table(levels, COLUMNS)
