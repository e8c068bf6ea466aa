"""HTTP calls to inference servers (weight sync, probes, pause/resume): one client with the trial's token, one error
type per way a call can fail (a timeout, an unreachable server, a non-2xx answer), each naming the server and what was
asked. Every backend's control requests go through `call`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import httpx

from rlkit.errors import StepError
from rlkit.servers.backend import Server
from rlkit.servers.tls import shared_tls

T = TypeVar("T")

# What a client sees when a server's process is gone: the connection is refused, or cut without an answer (closed
# before the response: RemoteProtocolError; reset while reading or sending: ReadError, WriteError).
SERVER_GONE_ERRORS: tuple[type[httpx.TransportError], ...] = (
    httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def server_client(token: str, *, max_connections: int = 32) -> httpx.AsyncClient:
    """An HTTP client for the functions below: bearer token on every request, no proxy from the environment.

    Timeouts are given per request by each function.
    """
    return httpx.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        trust_env=False,
        verify=shared_tls(),
        limits=httpx.Limits(max_connections=max_connections),
    )


class ServerUnreachable(StepError):
    """The server did not accept the connection or dropped it: its process is gone (or going)."""


async def call(
    client: httpx.AsyncClient,
    server: Server,
    method: str,
    path: str,
    what: str,
    timeout: float,
    *,
    allow_404: bool = False,
    **kwargs: Any,
) -> httpx.Response:
    """One HTTP request; StepError naming `what`, the server and the timeout if it times out, fails or is not 2xx.

    The whole answer must come within `timeout`: httpx's timeout is per phase and per chunk, so a server trickling
    a byte every few seconds would hold the call (and the push or scoring waiting on it) forever.
    """
    request = client.request(method, f"{server.url}{path}", timeout=httpx.Timeout(timeout), **kwargs)
    try:
        response = await asyncio.wait_for(request, timeout)
    except TimeoutError as exc:  # the overall deadline (httpx's own timeouts are not TimeoutError subclasses)
        raise StepError(f"{server.label}: no complete answer within {timeout:g} s to {what} "
                        f"({method} {path})") from exc
    except httpx.TimeoutException as exc:
        raise StepError(f"{server.label}: no answer after {timeout:g} s while waiting for {what} "
                        f"({method} {path}): {type(exc).__name__}") from exc
    except SERVER_GONE_ERRORS as exc:
        raise ServerUnreachable(f"{server.label}: {what} ({method} {path}) failed, the server is "
                                f"unreachable: {type(exc).__name__}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise StepError(f"{server.label}: {what} ({method} {path}) failed: "
                        f"{type(exc).__name__}: {exc}") from exc
    if response.status_code >= 400 and not (allow_404 and response.status_code == 404):
        raise StepError(f"{server.label}: {what} ({method} {path}) answered HTTP {response.status_code}: "
                        f"{response.text[:1000]}")
    return response


def answer_json(response: httpx.Response, server: Server, what: str) -> Any:
    try:
        return response.json()
    except ValueError as exc:
        raise StepError(f"{server.label}: {what} did not answer JSON: {response.text[:300]!r}") from exc


def answer_object(response: httpx.Response, server: Server, what: str) -> dict[str, Any]:
    """The answer as a JSON object; StepError naming the server otherwise (a list or a string from a foreign or
    broken server would make the caller's `.get` an AttributeError)."""
    answer = answer_json(response, server, what)
    if not isinstance(answer, dict):
        raise StepError(f"{server.label}: {what} did not answer a JSON object: {response.text[:300]!r}")
    return answer


async def timed(phases: dict[str, float], name: str, step: Awaitable[T]) -> T:
    start = time.monotonic()
    try:
        return await step
    finally:
        phases[name] = time.monotonic() - start
