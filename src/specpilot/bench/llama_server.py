"""A native `llama-server` process on a loopback port, driven with token ids (the llama-cpp peer).

Token ids go in and come out, so llama.cpp decodes exactly the prompt our methods decode, and the
time charged is the server's own prompt + generation time (its `timings`), as our methods are
charged their engine time: HTTP and JSON are not part of either decoder.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from specpilot.config import SamplingConfig
from specpilot.errors import ConfigError

LLAMA_CPP_VERSION = "0.3.36"
BUILD_HINT = "bash scripts/build_llama_cpp.sh"


def build_root() -> Path:
    """Where scripts/build_llama_cpp.sh unpacks the source (src/) and puts the binaries (bin/)."""
    from specpilot.files import cache_root

    return cache_root() / "llama.cpp" / LLAMA_CPP_VERSION


def binary_dir() -> Path:
    """$SPECPILOT_LLAMA_CPP_BIN, else where scripts/build_llama_cpp.sh puts the binaries."""
    env = os.environ.get("SPECPILOT_LLAMA_CPP_BIN")
    return Path(env) if env else build_root() / "bin"


def find_binary(name: str = "llama-server") -> Path | None:
    path = binary_dir() / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def completion_request(
    prompt_ids: list[int],
    max_new_tokens: int,
    sampling: SamplingConfig,
    seed: int,
    stop_on_eos: bool = True,
) -> dict:
    """The /completion body: these ids, no prompt cache (each run starts cold, like ours), the
    token ids back (an end-of-generation token included, as ours); temperature 0 is greedy."""
    body = {
        "prompt": list(prompt_ids),
        "n_predict": max_new_tokens,
        "cache_prompt": False,
        "return_tokens": True,
        "stream": False,
        "seed": seed,
        "temperature": sampling.temperature,
        "ignore_eos": not stop_on_eos,
    }
    if not sampling.greedy:
        body.update(top_k=sampling.top_k, top_p=sampling.top_p, min_p=0.0)
    return body


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    seconds: float
    """The server's prompt + generation time."""
    timings: dict = field(default_factory=dict)
    """llama-server's `timings` as answered (speculative modes add draft_n, draft_n_accepted)."""


def parse_completion(body: dict) -> Completion:
    tokens, timings = body.get("tokens"), body.get("timings")
    if tokens is None or timings is None:
        raise ConfigError(f"llama-server answered without tokens or timings: {sorted(body)}")
    return Completion(
        [int(t) for t in tokens],
        (float(timings["prompt_ms"]) + float(timings["predicted_ms"])) / 1000,
        timings,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One server process for one bench run: one slot, no UI, no host-memory prompt cache."""

    def __init__(self, binary: Path, args: list[str], startup_s: float = 600.0):
        self.port = free_port()
        command = [str(binary), "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.log = tempfile.TemporaryFile("w+")  # a pipe nobody reads would block its logging
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready(startup_s, command)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self, startup_s: float, command: list[str]) -> None:
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                error = self.log.read()[-2000:]
                raise ConfigError(f"llama-server exited ({' '.join(command)}):\n{error}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.close()
        raise ConfigError(f"llama-server did not become ready in {startup_s:.0f} s")

    def complete(self, body: dict) -> Completion:
        request = urllib.request.Request(
            f"{self.url}/completion",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=3600) as response:
            return parse_completion(json.load(response))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
