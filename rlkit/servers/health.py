"""Ports and readiness for inference servers: pick a free port, wait until `GET /health` answers 200."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx

from rlkit.errors import StepError
from rlkit.nameresolve.servers import http_url
from rlkit.servers.tls import shared_tls

T = TypeVar("T")


class ServerNotHealthy(StepError):
    """An inference server did not become healthy in time, or its process exited first."""


def find_free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on `host` right now (the OS picks it; another process may still take it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def answers_health(address: str, timeout: float = 5.0) -> bool:
    """One `GET http://{address}/health`: True when it answers 200 (a name-resolve record can outlive its server's
    process by the record's ttl, so liveness is asked of the server itself). Proxy variables are ignored."""
    return get_statuses([f"{http_url(address)}/health"], timeout)[0] == 200


def probe_health(addresses: Sequence[str], timeout: float, *, max_parallel: int = 16) -> list[bool]:
    """`answers_health` of each address, in the order given, asked at once (at most `max_parallel` at a time): a job
    whose servers died must not cost `rlkit status` one full timeout per server."""
    urls = [f"{http_url(address)}/health" for address in addresses]
    return [status == 200 for status in get_statuses(urls, timeout, max_parallel=max_parallel)]


def get_statuses(urls: Sequence[str], timeout: float, *, max_parallel: int = 16,
                 headers: Mapping[str, str] | None = None) -> list[int | str]:
    """`GET` each URL at once (at most `max_parallel` at a time, with `headers`): its HTTP status, or why there is
    none. The whole answer within `timeout`: httpx's timeout is per chunk, so a server trickling its answer would
    hold the caller (`rlkit status`, the trainer waiting for its servers, a server step) as long as it trickled."""
    if not urls:
        return []

    async def ask_all() -> list[int | str]:
        limit = asyncio.Semaphore(max_parallel)
        async with httpx.AsyncClient(trust_env=False, verify=shared_tls()) as client:
            async def one(url: str) -> int | str:
                async with limit:
                    try:
                        answer = client.get(url, headers=headers, timeout=timeout)
                        return (await asyncio.wait_for(answer, timeout)).status_code
                    except TimeoutError:
                        return f"no complete answer within {timeout:g} s"
                    except httpx.HTTPError as exc:
                        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

            return list(await asyncio.gather(*(one(url) for url in urls)))

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: a plain thread (the trainer's, rlkit status's)
        return run_with_lookups_apart(ask_all())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="health") as pool:  # asked from inside an event loop
        return pool.submit(run_with_lookups_apart, ask_all()).result()


def run_with_lookups_apart(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, but the loop's host name lookups (getaddrinfo, which httpx asks the loop for) run in
    daemon threads of their own: in the default executor, one the system resolver holds (an unreachable DNS server,
    a stuck NSS module) would hold the end of `asyncio.run`, which waits for that executor, and the interpreter's
    exit, past every deadline of the calls that asked for it."""
    with asyncio.Runner() as runner:
        runner.get_loop().getaddrinfo = _lookup_apart  # type: ignore[method-assign]
        return runner.run(main)


# the lookups under way, by getaddrinfo's arguments: each caller's way to its answer (its loop's settle)
_LOOKUPS: dict[tuple[Any, ...], list[Callable[[list[Any] | None, BaseException | None], None]]] = {}
_LOOKUPS_LOCK = threading.Lock()


async def _lookup_apart(host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0,
                        flags: int = 0) -> list[Any]:
    """getaddrinfo in a daemon thread; a call while the same lookup is under way (a probe every second, a resolver
    that hangs) waits on that one instead of starting another, so threads do not pile up while it hangs."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[list[Any]] = loop.create_future()

    def settle(result: list[Any] | None, error: BaseException | None) -> None:
        if not answer.done():  # the caller may have given up (its deadline)
            if error is not None:
                answer.set_exception(error)
            else:
                answer.set_result(result or [])

    def tell(result: list[Any] | None, error: BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for this answer any more
            loop.call_soon_threadsafe(settle, result, error)

    key = (host, port, family, type, proto, flags)

    def look_up() -> None:
        try:
            result, error = socket.getaddrinfo(host, port, family, type, proto, flags), None
        except BaseException as exc:  # handed to the callers
            result, error = None, exc
        with _LOOKUPS_LOCK:
            waiting = _LOOKUPS.pop(key, [])  # the next call looks up afresh (DNS may have changed)
        for told in waiting:
            told(result, error)

    with _LOOKUPS_LOCK:
        first = key not in _LOOKUPS
        _LOOKUPS.setdefault(key, []).append(tell)
    if first:
        threading.Thread(target=look_up, name="rlkit-health-lookup", daemon=True).start()
    return await answer


def wait_healthy(url: str, timeout: float, *, process: subprocess.Popen[Any] | None = None,
                 gave_up: Callable[[], str | None] | None = None) -> None:
    """Poll `GET {url}/health` until it answers 200; raise `ServerNotHealthy` after `timeout` seconds.

    If `process` is given and exits meanwhile, raise at once with its exit code instead of waiting out the timeout;
    likewise when `gave_up` returns a reason (the engine said it cannot start, but its process lives on).
    Proxy variables are ignored: the servers are on the cluster's own network.
    """
    base = url.rstrip("/")
    health = f"{base}/health"
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while True:
        if process is not None and (code := process.poll()) is not None:
            raise ServerNotHealthy(
                f"the server process for {base} (pid {process.pid}) exited with code {code} "
                f"before {health} answered 200"
            )
        if gave_up is not None and (reason := gave_up()) is not None:
            raise ServerNotHealthy(f"{health} did not answer 200, and will not: {reason}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ServerNotHealthy(f"{health} did not answer 200 within {timeout:g} s (last: {last})")
        status = get_statuses([health], min(5.0, max(remaining, 0.1)))[0]
        if status == 200:
            return
        last = f"HTTP {status}" if isinstance(status, int) else status
        time.sleep(min(1.0, max(deadline - time.monotonic(), 0.0)))
