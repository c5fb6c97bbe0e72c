"""`specpilot serve --api-key`: every /v1 route refuses a missing, wrong or malformed key with
401 (before reading the body) and serves with the right one; /health and /metrics stay open;
SPECPILOT_API_KEY sets the key and --api-key wins over it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from serve_fixtures import ServerThread, messages, tiny_engine, tiny_pair

from specpilot.config import GenerationConfig
from specpilot.errors import ConfigError
from specpilot.serve import create_app
from specpilot.serve.auth import API_KEY_ENV, resolve_api_key

MODEL = "tiny"
KEY = "sk-test-0123456789"
CHAT = {"model": MODEL, "messages": messages("w5 w6"), "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": "w5 w6", "max_tokens": 2}
ROUTES = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", COMPLETION),
    ("POST", "/v1/completions", {**COMPLETION, "stream": True}),
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/chat/completions", {**CHAT, "stream": True}),
    ("GET", "/v1/nothing", None),
]
BAD_HEADERS = [
    {},
    {"Authorization": ""},
    {"Authorization": "Bearer"},
    {"Authorization": "Bearer wrong-key"},
    {"Authorization": KEY},
    {"Authorization": f"Basic {KEY}"},
    {"Authorization": f"Bearer {KEY}x"},
    {"Authorization": f"Bearer  {KEY}"},
    {"Authorization": f"Bearer {KEY[:-1]}"},
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny_pair(tmp_path_factory.mktemp("auth"))


@pytest.fixture(scope="module")
def server(pair):
    engine = tiny_engine(*pair, batch_size=2)
    app = create_app(engine, MODEL, GenerationConfig(4), api_key=KEY)
    with ServerThread(app) as running:
        yield running


def assert_refused(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key" and "Authorization: Bearer" in error["message"]


@pytest.mark.parametrize("headers", BAD_HEADERS)
@pytest.mark.parametrize("method,path,body", ROUTES)
def test_a_missing_or_wrong_key_gets_401_on_every_v1_route(server, method, path, body, headers):
    assert_refused(httpx.request(method, server.url + path, json=body, headers=headers))


def test_two_authorization_headers_are_refused(server):
    headers = [("Authorization", f"Bearer {KEY}"), ("Authorization", "Bearer other")]
    assert_refused(httpx.post(server.url + "/v1/completions", json=COMPLETION, headers=headers))


def test_the_key_is_checked_before_the_body_is_read(server):
    """A request announcing 1 MB but sending none is answered at once, not after a read."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000\r\n\r\n{"
        )
        assert raw.recv(4096).split(b"\r\n")[0].endswith(b"401 Unauthorized")


def test_the_right_key_serves_every_route(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    chat = client.chat.completions.create(**CHAT, temperature=0)
    streamed = client.chat.completions.create(**CHAT, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == (
        chat.choices[0].message.content
    )
    completion = client.completions.create(**COMPLETION, temperature=0)
    streamed = client.completions.create(**COMPLETION, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == completion.choices[0].text
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_health_and_metrics_stay_open_and_count_refusals(server):
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    httpx.get(server.url + "/v1/models")
    metrics = httpx.get(server.url + "/metrics")
    assert metrics.status_code == 200
    assert 'specpilot:request_rejected_total{reason="unauthorized"}' in metrics.text


def test_the_flag_wins_over_the_environment(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert resolve_api_key(None) is None
    monkeypatch.setenv(API_KEY_ENV, "")
    assert resolve_api_key(None) is None
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert resolve_api_key(None) == "from-env"
    assert resolve_api_key("from-flag") == "from-flag"
    for bad in ("", "two words", "tab\there", "ключ"):
        with pytest.raises(ConfigError):
            resolve_api_key(bad)


def test_the_serve_command_reads_the_key_from_flag_or_environment(pair, tmp_path):
    """`specpilot serve` with SPECPILOT_API_KEY set and --api-key given: the flag's key
    serves, the environment's is refused; without the flag the environment's key serves."""
    for flag, good, bad in (("flag-key", "flag-key", "env-key"), (None, "env-key", "wrong")):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        argv = [sys.executable, "-m", "specpilot.cli", "serve", "--target", pair[0]]
        argv += ["--draft", pair[1], "--dtype", "float32", "--max-length", "128"]
        argv += ["--max-batch", "1", "--port", str(port), "--model-name", MODEL]
        argv += ["--max-new-tokens", "2"] + (["--api-key", flag] if flag else [])
        env = {**os.environ, API_KEY_ENV: "env-key"}
        log_path = tmp_path / f"serve-{port}.log"
        with open(log_path, "w") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                url = f"http://127.0.0.1:{port}"
                wait_healthy(url, process, log_path)
                headers = {"Authorization": f"Bearer {good}"}
                assert httpx.get(url + "/v1/models", headers=headers).status_code == 200
                headers = {"Authorization": f"Bearer {bad}"}
                assert_refused(httpx.get(url + "/v1/models", headers=headers))
            finally:
                process.terminate()
                process.wait(timeout=30)


def wait_healthy(url: str, process: subprocess.Popen, log_path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.2)
