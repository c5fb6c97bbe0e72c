"""A real server on 127.0.0.1 for tests: a tiny target/draft pair saved as model folders,
loaded the way the CLI loads them, served by uvicorn in a background thread."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import openai
import uvicorn
from tiny import perturbed, save_tiny, tiny_model, tiny_tokenizer

from specpilot.api import build_engine, load_models

WORDS = [f"w{i}" for i in range(4, 96)]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant{% endif %}"
)


def tiny_pair(folder):
    """Target and draft model folders sharing a tokenizer with a chat template."""
    target = save_tiny(folder / "target", words=WORDS, seed=0)
    draft = folder / "draft"
    perturbed(tiny_model(vocab_size=len(WORDS) + 4, seed=0), 0.3).save_pretrained(draft)
    for path in (target, draft):
        tokenizer = tiny_tokenizer(WORDS)
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(path)
    return str(target), str(draft)


def tiny_engine(target: str, draft: str, batch_size: int, max_length: int = 128):
    """What `specpilot generate/serve --drafter model --k 3 --dtype float32` builds."""
    models = load_models(target, draft, "float32", "cpu", max_length, batch_size)
    return build_engine(models, "model", "constant", k="3")


class ServerThread:
    """uvicorn serving `app` on a free loopback port until `stop()`."""

    def __init__(self, app):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.socket.close()


HOSTILE = [
    ("not json at all", 400, None),
    ('{"model": "tiny", "messages": [{"role": "user", "content": "w5"}]', 400, None),
    ("[1, 2, 3]", 400, None),
    ({"model": "tiny"}, 400, "messages"),
    ({"model": "tiny", "messages": []}, 400, "messages"),
    ({"model": "tiny", "messages": [{"role": "wizard", "content": "w5"}]}, 400, None),
    ({"model": "tiny", "messages": [{"role": "user", "content": 5}]}, 400, None),
    (
        {"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "max_tokens": 0},
        400,
        "max_tokens",
    ),
    (
        {"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "max_tokens": "x"},
        400,
        "max_tokens",
    ),
    ({"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "n": 2}, 400, "n"),
    (
        {"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "logprobs": True},
        400,
        "logprobs",
    ),
    (
        {"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "temperature": -1},
        400,
        "temperature",
    ),
    ({"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "top_p": 0}, 400, "top_p"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "stop": [""]}, 400, "stop"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "tools": []}, 400, "tools"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "seed": -3}, 400, "seed"),
    ({"model": "nope", "messages": [{"role": "user", "content": "w5"}]}, 404, "model"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "w5 " * 300}]}, 400, "prompt"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "   "}]}, 400, "prompt"),
]
COMPLETION_HOSTILE = [
    ({"model": "tiny", "prompt": [5, 6, 10**9]}, 400, "prompt"),
    ({"model": "tiny", "prompt": [5, -1]}, 400, "prompt"),
    ({"model": "tiny", "prompt": []}, 400, "prompt"),
    ({"model": "tiny", "prompt": ["w5", "w6"]}, 400, "prompt"),
    ({"model": "tiny", "prompt": "w5", "echo": True}, 400, "echo"),
    ({"model": "tiny", "prompt": "w5", "best_of": 3}, 400, "best_of"),
    ({"model": "tiny", "prompt": list(range(4, 94)) * 2}, 400, "prompt"),
]
BAD_INPUT = [
    *[("chat/completions", *case) for case in HOSTILE],
    *[("completions", *case) for case in COMPLETION_HOSTILE],
]
"""(route, body, status, param): requests a server must refuse, with the error's param."""


def check_refused(url: str, route: str, body, status: int, param: str | None) -> None:
    """POST `body` (a dict, or raw text) and check the OpenAI error that comes back."""
    url = f"{url}/v1/{route}"
    if isinstance(body, str):
        response = httpx.post(url, content=body, headers={"content-type": "application/json"})
    else:
        response = httpx.post(url, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"]
    if param is not None:
        assert param in (error["param"] or "") or param in error["message"]


def messages(text: str) -> list[dict]:
    """One user turn."""
    return [{"role": "user", "content": text}]


def openai_client(url: str) -> openai.OpenAI:
    """The official client for the server at `url` (no retries: a test sees each answer)."""
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
