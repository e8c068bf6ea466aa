"""Bearer-token guard for inference servers, as a pure ASGI middleware (stdlib only: vLLM imports it at startup).

vLLM's `--api-key` covers only /v1, /v2, /inference (and a few more) paths: with `VLLM_SERVER_DEV_MODE=1` the RL
routes (`/collective_rpc`, `/pause`, `/update_weights`, ...) would be open to anyone who reaches the port. Loaded with
`--middleware rlkit.servers.auth.TokenGuard`, `TokenGuard` sits in front of every route and requires
`Authorization: Bearer <token>` on every HTTP path except exactly `/health`.

The token comes from the environment variable `RLKIT_SERVER_TOKEN` (never from argv, which any local user can read
in /proc/<pid>/cmdline). If it is empty or unset the guard fails closed: everything but `/health` is refused.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

TOKEN_ENV = "RLKIT_SERVER_TOKEN"
OPEN_PATH = "/health"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

logger = logging.getLogger(__name__)

_UNAUTHORIZED_BODY = json.dumps({"error": "missing or wrong bearer token"}).encode()
_WS_POLICY_VIOLATION = 1008


class TokenGuard:
    """ASGI middleware: 401 for every HTTP request without the right bearer token, except on path `/health`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        token = os.environ.get(TOKEN_ENV, "")
        self._token: bytes | None = token.encode() if token else None
        if self._token is None:
            # ERROR, not WARNING: inside a vLLM 0.32 API server the root logger's effective level is ERROR, so a
            # warning from a non-vllm logger is silently dropped (seen on the CPU build).
            logger.error(
                "rlkit TokenGuard: %s is empty or unset; refusing every request except %s (fail closed)",
                TOKEN_ENV,
                OPEN_PATH,
            )

    def _authorized(self, scope: Scope) -> bool:
        """True if the request carries exactly one `Authorization: Bearer <token>` header with the right token."""
        if self._token is None:
            return False
        values = [value for name, value in scope.get("headers") or () if name.lower() == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _, credentials = bytes(values[0]).strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(credentials.strip(), self._token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind == "http":
            if scope.get("path") == OPEN_PATH or self._authorized(scope):
                await self.app(scope, receive, send)
                return
            await _send_unauthorized(send)
            return
        if kind == "websocket":
            if self._authorized(scope):
                await self.app(scope, receive, send)
                return
            # Closing before accepting makes the server answer the handshake with 403.
            await send({"type": "websocket.close", "code": _WS_POLICY_VIOLATION, "reason": ""})
            return
        # lifespan and any other scope type: nothing to guard.
        await self.app(scope, receive, send)


async def _send_unauthorized(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(_UNAUTHORIZED_BODY)).encode()),
                (b"www-authenticate", b"Bearer"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": _UNAUTHORIZED_BODY, "more_body": False})
