"""`specpilot serve --backend hf-generate`, the baseline: transformers' own `generate` behind the
same app. Greedy answers (float32) must be exactly specpilot's engine's for the same prompts,
plain or with transformers' assisted generation; streaming, stop strings, seeded sampling,
disconnects, a full queue and bad input behave as with the specpilot backend."""

from __future__ import annotations

import asyncio
import threading

import httpx
import openai
import pytest
from serve_fixtures import (
    BAD_INPUT,
    ServerThread,
    check_refused,
    messages,
    openai_client,
    tiny_engine,
    tiny_pair,
)

from specpilot.api import load_models
from specpilot.cli import main
from specpilot.config import GenerationConfig
from specpilot.serve import create_app
from specpilot.serve.hf_worker import HFGenerateWorker

MODEL = "tiny"
MAX_NEW = 12
PROMPTS = [" ".join(f"w{4 + (i * 11 + j * 5) % 90}" for j in range(2 + i % 4)) for i in range(8)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny_pair(tmp_path_factory.mktemp("serve_hf"))


@pytest.fixture(scope="module")
def solo(pair):
    """specpilot's engine, one prompt at a time: the answers to match."""
    return tiny_engine(*pair, batch_size=1)


def hf_server(target: str, draft: str | None = None) -> ServerThread:
    """What `specpilot serve --backend hf-generate [--draft] --dtype float32` serves."""
    models = load_models(target, draft, "float32", "cpu", 128, backend="hf")
    worker = HFGenerateWorker(models.target, models.draft)
    app = create_app(worker, MODEL, GenerationConfig(MAX_NEW), max_queue=16)
    server = ServerThread(app)
    server.app = app
    return server


@pytest.fixture(scope="module")
def server(pair):
    with hf_server(pair[0]) as running:
        yield running


@pytest.fixture
def client(server):
    return openai_client(server.url)


def chat_text(client, prompt: str, stream: bool = False, **fields) -> str:
    answer = client.chat.completions.create(
        model=MODEL, messages=messages(prompt), temperature=0, stream=stream, **fields
    )
    if stream:
        return "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    return answer.choices[0].message.content


def test_greedy_answers_equal_the_engines(server, client, solo):
    for i, prompt in enumerate(PROMPTS):
        expected = solo.generate(messages(prompt), GenerationConfig(MAX_NEW))
        assert chat_text(client, prompt, stream=bool(i % 2)) == expected.text
    prompt = PROMPTS[2]
    expected = solo.generate(messages(prompt), GenerationConfig(MAX_NEW))
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages(prompt),
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    usage = chunks[-1].usage
    assert usage.completion_tokens == len(expected.token_ids)
    spec = usage.model_extra["speculative_decoding"]
    assert spec["verify_steps"] == spec["num_spec_steps"] == spec["num_accepted_draft_tokens"] == 0
    raw = solo.tokenizer(prompt)["input_ids"]
    completion = client.completions.create(model=MODEL, prompt=raw, temperature=0, max_tokens=5)
    assert completion.choices[0].text == solo.generate(raw, GenerationConfig(5)).text
    assert completion.choices[0].finish_reason == "length"


def test_stop_strings_and_seeded_sampling(server, client, solo):
    prompt = PROMPTS[3]
    full = solo.generate(messages(prompt), GenerationConfig(MAX_NEW))
    stop = full.text.split()[3]
    expected = solo.generate(messages(prompt), GenerationConfig(MAX_NEW, stop_strings=(stop,)))
    for stream in (False, True):
        assert chat_text(client, prompt, stream, stop=stop) == expected.text
    sampled = [
        client.chat.completions.create(
            model=MODEL, messages=messages(prompt), temperature=1.0, top_p=0.9, seed=5
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


def test_concurrent_requests_queue_and_all_get_their_answer(server, solo):
    expected = [solo.generate(messages(p), GenerationConfig(MAX_NEW)).text for p in PROMPTS]

    async def ask_all() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="none", max_retries=0
        ) as client:
            answers = [
                client.chat.completions.create(model=MODEL, messages=messages(p), temperature=0)
                for p in PROMPTS
            ]
            return [a.choices[0].message.content for a in await asyncio.gather(*answers)]

    assert asyncio.run(ask_all()) == expected
    health = httpx.get(server.url + "/health").json()
    assert (health["running"], health["waiting"], health["slots"]) == (0, 0, 1)
    metrics = httpx.get(server.url + "/metrics").text
    assert "specpilot:time_to_first_token_seconds_count" in metrics


def test_disconnect_and_full_queue(server, client):
    body = {"model": MODEL, "messages": messages(PROMPTS[0]), "stream": True, "max_tokens": 100}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        next(response.iter_lines())
    worker = server.app.state.worker
    worker.max_queue = 0
    try:
        with pytest.raises(openai.APIStatusError) as refused:
            client.completions.create(model=MODEL, prompt="w5 w6")
        assert refused.value.status_code == 503
    finally:
        worker.max_queue = 16
    assert client.completions.create(model=MODEL, prompt="w5 w6", max_tokens=3).choices
    assert worker.idle


def test_a_cancelled_request_stops_generating(server):
    """Cancelled mid-generate (a client gone): generate stops at the next token."""
    worker = server.app.state.worker
    done = threading.Event()
    request = worker.submit(
        worker.tokenizer(PROMPTS[0])["input_ids"],
        GenerationConfig(100),
        lambda tokens: request.cancel(),
        lambda request: done.set(),
    )
    assert done.wait(10)
    assert request.result.finish_reason == "cancelled" and len(request.result.token_ids) == 1


def test_a_generate_failure_is_a_500_and_the_server_goes_on(server, client, monkeypatch):
    model = server.app.state.worker.model
    generate = model.generate

    def broken(*args, **kwargs):
        monkeypatch.setattr(model, "generate", generate)  # fail once
        raise RuntimeError("boom")

    monkeypatch.setattr(model, "generate", broken)
    with pytest.raises(openai.InternalServerError):
        client.completions.create(model=MODEL, prompt="w5 w6", temperature=0)
    answer = client.completions.create(model=MODEL, prompt="w5 w6", temperature=0, max_tokens=3)
    assert answer.usage.completion_tokens >= 1


@pytest.mark.parametrize("route,body,status,param", BAD_INPUT)
def test_bad_input_gets_the_same_4xx(server, route, body, status, param):
    check_refused(server.url, route, body, status, param)


def test_assisted_generation_gives_the_engines_greedy_answers(pair, solo):
    with hf_server(*pair) as running:
        client = openai_client(running.url)
        for i, prompt in enumerate(PROMPTS[:4]):
            expected = solo.generate(messages(prompt), GenerationConfig(MAX_NEW)).text
            assert chat_text(client, prompt, stream=bool(i % 2)) == expected


def test_method_flags_are_refused_before_loading(capsys):
    argv = ["serve", "--backend", "hf-generate", "--target", "no-such-model", "--k", "3"]
    assert main([*argv, "--max-batch", "4"]) == 2
    error = capsys.readouterr().err
    assert "--k" in error and "--max-batch" in error
    assert "--backend auto, ggml, torch or hf" in error
