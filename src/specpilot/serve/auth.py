"""API-key authentication for the server's `/v1` routes (`specpilot serve --api-key`).

An ASGI middleware rather than a FastAPI dependency: it answers before the request body is read
(a dependency runs after FastAPI has parsed the body), so an unauthenticated client can make the
server neither parse nor buffer anything. `/health` and `/metrics` stay open, as vLLM's do, so
load balancers and Prometheus need no key. Refusals are OpenAI error objects (401,
`invalid_api_key`) with `WWW-Authenticate: Bearer`, as vLLM and llama-server answer; keys are
compared in constant time.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Callable

from specpilot.config import require
from specpilot.serve.protocol import error_body

API_KEY_ENV = "SPECPILOT_API_KEY"
"""The environment variable `specpilot serve` reads the key from when --api-key is not given."""
PROTECTED_PREFIX = "/v1"


def resolve_api_key(flag: str | None) -> str | None:
    """The key `specpilot serve` requires: --api-key if given, else $SPECPILOT_API_KEY if set
    and not empty, else None (no authentication); checked before any model loads."""
    return check_api_key(flag if flag is not None else os.environ.get(API_KEY_ENV) or None)


def check_api_key(key: str | None) -> str | None:
    """`key` unchanged, or a ConfigError for one that cannot travel in an HTTP header."""
    if key is not None:
        require(bool(key), "the API key must not be empty", ("api_key",))
        require(
            key.isascii() and key.isprintable() and not any(c.isspace() for c in key),
            "the API key must be printable ASCII without spaces (it travels in an HTTP header)",
        )
    return key


class APIKeyAuth:
    """Require `Authorization: Bearer <api_key>` on every HTTP path under `/v1`."""

    def __init__(self, app, api_key: str, on_reject: Callable[[], None] = lambda: None):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.on_reject = on_reject

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not _protected(scope["path"]) or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        self.on_reject()
        message = "invalid or missing API key: send the header 'Authorization: Bearer <key>'"
        body = json.dumps(error_body(message, "invalid_request_error", None, "invalid_api_key"))
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body.encode()})

    def _allowed(self, scope) -> bool:
        given = [value for name, value in scope["headers"] if name == b"authorization"]
        return len(given) == 1 and hmac.compare_digest(given[0], self.expected)


def _protected(path: str) -> bool:
    return path == PROTECTED_PREFIX or path.startswith(PROTECTED_PREFIX + "/")
