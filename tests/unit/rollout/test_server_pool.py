"""ServerPool's reading of failures: a server whose process is gone (however the cut shows up) is dropped, and a
pool with no server left raises ServersUnreachable (the trainer then checkpoints and its retry resumes), while a
live server's errors stay ordinary request failures.

The servers are STAND-INS: an httpx.MockTransport answering vLLM's /v1/completions shape or failing as told; no
vLLM runs here (the real server loss is in tests/integration/test_recovery.py and test_recovery_retries.py).
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
    pool = ServerPool(servers, "token", timeout=5.0, retries=retries, max_in_flight=4, retry_delay=0.0)

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


def test_a_dropped_server_s_request_in_flight_goes_to_another_server_at_once() -> None:
    """Server a takes the request and never answers (a stopped process: the connection is accepted, no reply comes);
    dropping it (the controller found it silent) cancels that call, and the request is answered by b, counted as
    rerouted, long before the request's timeout."""
    servers = [Server(index=0, address="a:1", model="/m", backend="vllm"),
               Server(index=1, address="b:1", model="/m", backend="vllm")]
    pool = ServerPool(servers, "token", timeout=60.0, retries=3, max_in_flight=4)
    arrived = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.netloc == b"a:1":
            arrived.set()
            await asyncio.sleep(3600)
        return _answer(request)

    async def main() -> tuple[Server, float]:
        await pool.aclose()
        pool._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        loop = asyncio.get_running_loop()
        started = loop.time()
        request = asyncio.ensure_future(pool.complete([1, 2], SamplingParams(n=1, max_new_tokens=4), prefer=0))
        await asyncio.wait_for(arrived.wait(), 5)
        assert pool.drop(0) == 1 and [s.index for s in pool.servers] == [1]
        server, _ = await asyncio.wait_for(request, 5)
        await pool.aclose()
        return server, loop.time() - started

    server, took = asyncio.run(main())
    assert server.address == "b:1" and pool.rerouted == 1 and took < 5


def test_the_last_server_is_not_dropped_and_a_cancelled_rollout_stays_cancelled() -> None:
    servers = [Server(index=0, address="a:1", model="/m", backend="vllm")]
    pool = ServerPool(servers, "token", timeout=60.0, retries=3, max_in_flight=4)

    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(3600)
        return _answer(request)

    async def main() -> None:
        await pool.aclose()
        pool._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        request = asyncio.ensure_future(pool.complete([1], SamplingParams(n=1, max_new_tokens=4)))
        await asyncio.sleep(0.1)
        assert pool.drop(0) == 0 and len(pool.servers) == 1  # nowhere else to send its requests
        request.cancel()  # the rollout itself is cancelled (the controller stops): no retry, no reroute
        with pytest.raises(asyncio.CancelledError):
            await request
        await pool.aclose()

    asyncio.run(main())
    assert pool.rerouted == 0
