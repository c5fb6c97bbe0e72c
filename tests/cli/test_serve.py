"""`specpilot serve` end to end: a real uvicorn server on 127.0.0.1 with a tiny target/draft
pair, spoken to with the official `openai` client and raw HTTP. Every answer must be exactly
what the engine gives that prompt alone (as `specpilot generate` does), whether or not 64
requests share the batch; a client that disconnects frees its slot; bad input gets a clear 4xx
and the server keeps serving."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_fixtures import (
    BAD_INPUT,
    ServerThread,
    check_refused,
    messages,
    openai_client,
    tiny_engine,
    tiny_pair,
)

from specpilot.cli import main
from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.serve import create_app
from specpilot.serve.spec_stats import SpecStats

MODEL = "tiny"
SLOTS = 64
MAX_NEW = 12
PROMPTS = [" ".join(f"w{4 + (i * 7 + j * 3) % 90}" for j in range(2 + i % 5)) for i in range(64)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny_pair(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def solo(pair):
    """The engine decoding one prompt at a time (batch size 1), as `specpilot generate` does."""
    return tiny_engine(*pair, batch_size=1)


@pytest.fixture(scope="module")
def server(pair):
    engine = tiny_engine(*pair, batch_size=SLOTS)
    app = create_app(engine, MODEL, GenerationConfig(MAX_NEW), max_queue=256)
    with ServerThread(app) as running:
        running.app = app
        yield running


@pytest.fixture
def client(server):
    return openai_client(server.url)


def wait_idle(server, timeout: float = 10.0) -> dict:
    """/health once no request is running or waiting."""
    deadline = time.monotonic() + timeout
    while True:
        health = httpx.get(server.url + "/health").json()
        if (health["running"], health["waiting"]) == (0, 0) or time.monotonic() > deadline:
            return health
        time.sleep(0.02)


def spec_counters(url: str) -> dict[str, float]:
    """The server's vLLM spec-decode counters (the per-position one as NAME/POSITION)."""
    counters = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name.startswith("vllm:spec_decode") and sample.name.endswith("_total"):
                assert sample.labels["model_name"] == MODEL and sample.labels["engine"] == "0"
                name = sample.name.removesuffix("_total")
                position = sample.labels.get("position")
                counters[name if position is None else f"{name}/{position}"] = sample.value
    return counters


def test_chat_and_completions_streamed_and_not(server, client, solo):
    prompt = PROMPTS[3]
    expected = solo.generate(messages(prompt), GenerationConfig(MAX_NEW))
    before = spec_counters(server.url)
    chat = client.chat.completions.create(model=MODEL, messages=messages(prompt), temperature=0)
    assert chat.choices[0].message.content == expected.text
    assert chat.choices[0].finish_reason == {"eos": "stop"}.get(expected.finish_reason, "length")
    usage = chat.usage
    after = spec_counters(server.url)
    counted = {
        name: n - before.get(name, 0) for name, n in after.items() if n > before.get(name, 0)
    }
    assert usage.completion_tokens == len(expected.token_ids)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    spec = usage.model_extra["speculative_decoding"]
    assert spec == SpecStats.of(expected.stats).usage()
    assert spec["verify_steps"] == expected.stats.steps
    assert spec["num_accepted_draft_tokens"] == expected.stats.accepted
    assert spec["mean_accepted_tokens"] == pytest.approx(expected.stats.mean_accepted_tokens)
    assert spec["num_accepted_draft_tokens"] > 0  # the counters below count something
    expected_counts = {
        "vllm:spec_decode_num_drafts": spec["num_spec_steps"],
        "vllm:spec_decode_num_draft_tokens": spec["num_draft_tokens"],
        "vllm:spec_decode_num_accepted_tokens": spec["num_accepted_draft_tokens"],
        **{
            f"vllm:spec_decode_num_accepted_tokens_per_pos/{i}": n
            for i, n in enumerate(spec["accepted_per_position"])
        },
    }
    assert counted == {name: n for name, n in expected_counts.items() if n}
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages(prompt),
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == len(expected.token_ids)
    assert chunks[-1].usage.model_extra["speculative_decoding"] == spec

    raw = solo.tokenizer(prompt)["input_ids"]
    expected = solo.generate(raw, GenerationConfig(MAX_NEW))
    completion = client.completions.create(model=MODEL, prompt=prompt, temperature=0)
    assert completion.choices[0].text == expected.text
    streamed = client.completions.create(model=MODEL, prompt=prompt, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected.text
    by_ids = client.completions.create(model=MODEL, prompt=raw, temperature=0, max_tokens=4)
    assert by_ids.choices[0].text == solo.generate(raw, GenerationConfig(4)).text
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_stop_strings_and_seeded_sampling(server, client, solo):
    prompt = PROMPTS[5]
    config = GenerationConfig(MAX_NEW)
    full = solo.generate(messages(prompt), config)
    stop = full.text.split()[3]  # a word the answer contains
    expected = solo.generate(messages(prompt), GenerationConfig(MAX_NEW, stop_strings=(stop,)))
    for stream in (False, True):
        answer = client.chat.completions.create(
            model=MODEL, messages=messages(prompt), temperature=0, stop=stop, stream=stream
        )
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in answer)
        else:
            text = answer.choices[0].message.content
        assert text == expected.text and stop not in text
    sampled = [
        client.chat.completions.create(
            model=MODEL, messages=messages(prompt), temperature=1.0, top_p=0.9, seed=5
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]
    alone = GenerationConfig(MAX_NEW, SamplingConfig(temperature=1.0, top_p=0.9), seed=5)
    assert sampled[0] == solo.generate(messages(prompt), alone).text


def test_64_concurrent_greedy_requests_equal_solo_runs(server, solo):
    """All in one running batch, a mix of chat and completions, streamed and not."""
    expected = [solo.generate(messages(p), GenerationConfig(MAX_NEW)).text for p in PROMPTS]

    async def ask(client: openai.AsyncOpenAI, i: int) -> str:
        request = dict(model=MODEL, messages=messages(PROMPTS[i]), temperature=0)
        if i % 2:
            stream = await client.chat.completions.create(**request, stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in stream])
        answer = await client.chat.completions.create(**request)
        return answer.choices[0].message.content

    async def ask_all() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="none", max_retries=0
        ) as client:
            return await asyncio.gather(*(ask(client, i) for i in range(len(PROMPTS))))

    assert asyncio.run(ask_all()) == expected
    assert wait_idle(server)["running"] == 0
    metrics = httpx.get(server.url + "/metrics").text
    assert "specpilot:time_to_first_token_seconds_count" in metrics
    assert spec_counters(server.url)["vllm:spec_decode_num_accepted_tokens"] > 0
    assert "specpilot:spec_decode" not in metrics


def test_a_generate_run_gives_the_same_answer(server, client, pair, capsys):
    """`specpilot generate` itself, for one prompt."""
    target, draft = pair
    argv = ["generate", "--target", target, "--draft", draft, "--k", "3", "--dtype", "float32"]
    argv += ["--max-length", "128", "--max-new-tokens", str(MAX_NEW), "--json"]
    assert main([*argv, "--prompt", PROMPTS[9]]) == 0
    cli = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    answer = client.chat.completions.create(
        model=MODEL, messages=messages(PROMPTS[9]), temperature=0
    )
    assert answer.choices[0].message.content == cli["text"]


def long_prompt(solo) -> str:
    """A prompt whose answer runs to the length limit (no EOS), so a stream lasts."""
    for prompt in PROMPTS:
        if solo.generate(messages(prompt), GenerationConfig(100)).finish_reason == "length":
            return prompt
    pytest.skip("no prompt of the tiny model runs 100 tokens without EOS")


def test_disconnect_mid_stream_frees_the_slot(server, solo, monkeypatch):
    prompt = long_prompt(solo)
    scheduler = server.app.state.worker.scheduler
    step = scheduler.step

    def step_until_cancelled():
        """Each step waits (up to 10 s) for the disconnect to cancel the running request, so
        a fast machine cannot finish all 100 tokens before the server notices the client left."""
        step()
        deadline = time.monotonic() + 10
        while any(not r.cancelled for r in scheduler.active) and time.monotonic() < deadline:
            time.sleep(0.005)

    monkeypatch.setattr(scheduler, "step", step_until_cancelled)
    body = {"model": MODEL, "messages": messages(prompt), "temperature": 0, "stream": True}
    body["max_tokens"] = 100
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        next(response.iter_lines())  # the first chunk: the request holds a slot
    health = wait_idle(server)
    assert (health["running"], health["waiting"]) == (0, 0)
    worker = server.app.state.worker
    assert sorted(worker.scheduler.free) == list(range(SLOTS))
    metrics = httpx.get(server.url + "/metrics").text
    assert 'specpilot:request_success_total{finished_reason="cancelled"}' in metrics


@pytest.mark.parametrize("route,body,status,param", BAD_INPUT)
def test_bad_input_gets_a_clear_4xx(server, route, body, status, param):
    check_refused(server.url, route, body, status, param)


def test_server_survives_abuse(server, client):
    """After oversized bodies, unknown routes, a full queue and the hostile inputs, the
    server still answers and no slot leaked."""
    with socket.create_connection(("127.0.0.1", server.port)) as raw:
        raw.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10000000000\r\n\r\n{"
        )
        assert raw.recv(4096).split(b"\r\n")[0].endswith(b"413 Request Entity Too Large")
    assert httpx.get(server.url + "/v1/nothing").status_code == 404
    worker = server.app.state.worker
    worker.max_queue = 0  # every request now finds the queue full
    try:
        with pytest.raises(openai.APIStatusError) as refused:
            client.completions.create(model=MODEL, prompt="w5 w6")
        assert refused.value.status_code == 503
        assert refused.value.response.headers["retry-after"] == "1"
    finally:
        worker.max_queue = 256
    answer = client.completions.create(model=MODEL, prompt="w5 w6", temperature=0, max_tokens=3)
    assert answer.choices[0].text is not None
    health = wait_idle(server)
    assert health["status"] == "ok" and sorted(worker.scheduler.free) == list(range(SLOTS))


def test_an_engine_failure_is_a_500_and_the_server_goes_on(server, client, monkeypatch):
    engine = server.app.state.worker.engine
    step = engine.step

    def broken(rows, finish_together=False):
        monkeypatch.setattr(engine, "step", step)  # fail once
        raise RuntimeError("boom")

    monkeypatch.setattr(engine, "step", broken)
    with pytest.raises(openai.InternalServerError):
        client.completions.create(model=MODEL, prompt="w5 w6", temperature=0)
    answer = client.completions.create(model=MODEL, prompt="w5 w6", temperature=0, max_tokens=3)
    assert answer.usage.completion_tokens >= 1


@pytest.mark.parametrize("backend", ["auto", "hf-generate"])
def test_the_serve_command_serves(pair, tmp_path, backend):
    """`specpilot serve` as a user starts it (a subprocess), then a request and a clean stop
    (also the transformers baseline, assisted by the draft)."""
    target, draft = pair
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "specpilot.cli", "serve", "--target", target, "--draft", draft]
    argv += ["--dtype", "float32", "--max-length", "128", "--backend", backend]
    if backend == "auto":
        argv += ["--max-batch", "2", "--k", "3", "--prefill-chunk", "2"]
    argv += ["--port", str(port), "--model-name", MODEL, "--max-new-tokens", "4"]
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, (
                tmp_path / "serve.log"
            ).read_text()
            time.sleep(0.2)
        client = openai_client(url)
        answer = client.completions.create(model=MODEL, prompt="w5 w6", temperature=0)
        assert answer.usage.completion_tokens <= 4
    finally:
        process.terminate()
        status = process.wait(timeout=30)
        log.close()
    # uvicorn shuts down cleanly, then re-raises the signal it caught
    output = (tmp_path / "serve.log").read_text()
    assert status in (0, -signal.SIGTERM) and "Application shutdown complete" in output, output


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--max-batch", "0"], "--batch-size"),
        (["--max-queue", "-1"], "--max-queue"),
        (["--prefill-chunk", "0"], "--prefill-chunk"),
        (["--backend", "hf-generate", "--prefill-chunk", "8"], "drop --prefill-chunk"),
    ],
)
def test_serve_flags_are_checked_before_loading(flags, message, capsys):
    assert main(["serve", "--target", "no-such-model", *flags]) == 2
    assert message in capsys.readouterr().err
