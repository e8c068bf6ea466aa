"""ServerPool's reading of failures: a server whose process is gone (however the cut shows up) is dropped, and a
pool with no server left raises ServersUnreachable (the trainer then checkpoints and its retry resumes), while a
live server's errors stay ordinary request failures.

The servers are STAND-INS: an httpx.MockTransport answering vLLM's /v1/completions shape or failing as told; no
vLLM runs here (the real server loss is in tests/integration/test_recovery.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from rlkit.errors import StepError
from rlkit.servers.backend import SamplingParams, Server
from rlkit.servers.pool import ServerPool, ServersUnreachable

Handler = Callable[[httpx.Request], httpx.Response]


def _answer(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"choices": [{"index": 0, "text": "7", "token_ids": [7],
                                                  "logprobs": {"token_logprobs": [-0.1]}, "finish_reason": "stop"}]})


def _complete(handlers: dict[str, Handler], retries: int = 3,
              prefer: int | None = None) -> tuple[ServerPool, Server | Exception]:
    servers = [Server(index=i, address=address, model="/m", backend="vllm") for i, address in enumerate(handlers)]
    pool = ServerPool(servers, "token", timeout=5.0, retries=retries, max_in_flight=4)

    async def main() -> Server | Exception:
        await pool.aclose()
        pool._client = httpx.AsyncClient(transport=httpx.MockTransport(
            lambda request: handlers[request.url.netloc.decode()](request)))
        try:
            server, completions = await pool.complete([1, 2], SamplingParams(n=1, max_new_tokens=4), prefer=prefer)
            assert completions[0].token_ids == [7]
            return server
        except StepError as exc:
            return exc
        finally:
            await pool.aclose()

    return pool, asyncio.run(main())


def _gone(kind: type[httpx.TransportError]) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        raise kind("the stand-in server's process is gone", request=request)
    return handler


@pytest.mark.parametrize("kind", [httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError])
def test_a_gone_server_is_dropped_and_the_request_goes_elsewhere(kind: type[httpx.TransportError]) -> None:
    pool, result = _complete({"a:1": _gone(kind), "b:1": _answer})
    assert isinstance(result, Server) and result.address == "b:1"
    assert [s.address for s in pool.servers] == ["b:1"] and pool.rerouted == 1


@pytest.mark.parametrize("kind", [httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError])
def test_no_server_left_is_servers_unreachable(kind: type[httpx.TransportError]) -> None:
    """A request cut by the kill (ReadError) and then refused everywhere: every server is gone, not a bad request
    (CI once saw a reset in-flight request turn this into a plain failure that stopped the trainer unsaved)."""
    cut_then_refused = iter([kind] + [httpx.ConnectError] * 10)

    def handler(request: httpx.Request) -> httpx.Response:
        raise next(cut_then_refused)("gone", request=request)

    _, result = _complete({"a:1": handler, "b:1": _gone(httpx.ConnectError)})
    assert isinstance(result, ServersUnreachable), result
    assert "no inference server accepts connections (4 attempts" in str(result)


def test_a_live_server_answering_errors_is_a_request_failure_not_a_lost_server() -> None:
    _, result = _complete({"a:1": lambda request: httpx.Response(500, json={"error": "stand-in"})}, retries=1)
    assert isinstance(result, StepError) and not isinstance(result, ServersUnreachable)
    assert "a request failed 2 times" in str(result) and "500" in str(result)


def test_a_preferred_server_gets_the_request_until_it_fails() -> None:
    """A multi-turn episode's later turns go to the server of its first (rlkit.rollout.groups): preferred over a
    less busy one, and left for another when it fails."""
    _, result = _complete({"a:1": _answer, "b:1": _answer}, prefer=1)
    assert isinstance(result, Server) and result.address == "b:1", "preferred, though server 0 sorts first"
    _, result = _complete({"a:1": _answer, "b:1": lambda request: httpx.Response(500, json={})}, prefer=1)
    assert isinstance(result, Server) and result.address == "a:1", "the retry goes elsewhere"
    _, result = _complete({"a:1": _answer}, prefer=5)
    assert isinstance(result, Server) and result.address == "a:1", "a server no longer in the pool is no preference"
