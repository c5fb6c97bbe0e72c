"""A real server on 127.0.0.1 for tests: a tiny target/draft pair saved as model folders,
loaded the way the CLI loads them, served by uvicorn in a background thread."""

from __future__ import annotations

import socket
import threading
import time

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
