"""HTTP client to the trial's inference servers: discovery through name resolve, spreading, retries.

Servers are found under `servers/<index>` in name resolve; only live entries (heart-beating owners) are used, so a
server from an earlier run or a dead step is never sent work. Requests go to the server with the fewest in flight;
a failed request is retried on another server when there is one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx

from rlkit.errors import StepError
from rlkit.nameresolve import read_servers, server_key
from rlkit.nameresolve.base import NameResolve
from rlkit.nameresolve.servers import server_step_name
from rlkit.servers.backend import Completion, SamplingParams, Server, backend_for
from rlkit.servers.completion_check import check_completions
from rlkit.servers.health import probe_health
from rlkit.servers.http import SERVER_GONE_ERRORS
from rlkit.servers.tls import shared_tls

_T = TypeVar("_T")
RETRY_DELAY_S, MAX_RETRY_DELAY_S = 0.5, 8.0  # a request's retries on servers that already failed it wait 0.5, 1, 2..


def most_retry_wait(retries: int) -> float:
    """The longest a request's retries may wait between attempts in all (every server failed it every time)."""
    return sum(min(RETRY_DELAY_S * 2**i, MAX_RETRY_DELAY_S) for i in range(retries))


def discover_servers(nr: NameResolve, auxiliary: str = "") -> list[Server]:
    """The live servers of the policy (of auxiliary model `auxiliary` when given) registered now, by index
    (malformed records are skipped: `read_servers`)."""
    return [Server(index=r.index, address=r.address, model=r.model, backend=r.backend)
            for r in read_servers(nr, auxiliary)]


def wait_for_servers(nr: NameResolve, expected: int, timeout: float, poll: float = 1.0, *,
                     healthy: bool = False, auxiliary: str = "") -> list[Server]:
    """Wait until `expected` servers (of auxiliary model `auxiliary` when given) are registered and live (and, with
    `healthy`, answer /health); StepError naming what is missing on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        servers = discover_servers(nr, auxiliary)
        if healthy:  # asked at once, each within what is left: servers that hang must not stretch the deadline
            left = min(5.0, max(0.5, deadline - time.monotonic()))
            answers = probe_health([s.address for s in servers], timeout=left)
            servers = [s for s, answered in zip(servers, answers, strict=True) if answered]
        if len(servers) >= expected:
            return servers
        if time.monotonic() >= deadline:
            seen = ", ".join(server_key(s.index, auxiliary) for s in servers) or "none"
            what = f"servers of auxiliary model {auxiliary}" if auxiliary else "inference servers"
            step = server_step_name(0, auxiliary)
            raise StepError(f"waited {timeout:.0f} s for {expected} {what} to register in "
                            f"{nr.describe_location()}; registered: {seen}. Check their step logs "
                            f"(rlkit logs TRIAL --step {step})")
        time.sleep(poll)


def why_servers_vanished(nr: NameResolve, known: dict[int, str]) -> str:
    """What became of each server that was registered (index -> address): its name-resolve record as name resolve
    sees it now, and whether the server itself still answers /health (a record can vanish while its server lives)."""
    if not known:
        return "no server had registered yet"
    indices = sorted(known)
    answers = probe_health([known[i] for i in indices], timeout=5.0)
    parts = []
    for index, healthy in zip(indices, answers, strict=True):
        alive = "answers /health" if healthy else "does not answer /health"
        parts.append(f"server {index} ({known[index]}, {alive}): {nr.describe_entry(server_key(index))}: "
                     f"{nr.diagnose(server_key(index))}")
    return "; ".join(parts)


class ServersUnreachable(StepError):
    """No inference server accepts connections: every one of them is gone (or going)."""


class ServerSilent(Exception):
    """A request cancelled because its server stopped answering /health (ServerPool.drop); sent elsewhere."""


class ServerPool:
    """Sends requests (completions; a reward model's token scores) to the least-busy live server, with retries on
    another server."""

    def __init__(self, servers: list[Server], token: str, *, timeout: float, retries: int,
                 max_in_flight: int, retry_delay: float = RETRY_DELAY_S) -> None:
        if not servers:
            raise StepError("no inference servers to send requests to")
        self.servers = servers
        self.retries = retries
        self.timeout = timeout
        self.retry_delay = retry_delay  # before a server that already failed the request is asked again: doubling
        self.rerouted = 0  # attempts that failed and were retried (on another server when there is one)
        self._calls: dict[int, set[asyncio.Future[Any]]] = {}  # server index -> its requests in flight
        self._dropped: set[asyncio.Future[Any]] = set()  # cancelled by `drop`: to send elsewhere
        self._limit = asyncio.Semaphore(max_in_flight)
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=30.0), trust_env=False,
                                         verify=shared_tls(), headers={"Authorization": f"Bearer {token}"},
                                         limits=httpx.Limits(max_connections=max_in_flight + len(servers)))

    def set_servers(self, live: list[Server]) -> None:
        """Replace the server list with the live ones (keeping counters of known servers); a dead server's
        in-flight requests fail on their own and are retried on the others."""
        known = {s.index: s for s in self.servers}
        updated = []
        for s in live:
            old = known.get(s.index)
            if old is not None and old.address == s.address:
                old.adapter = s.adapter  # LoRA: requests name the adapter of the version the server now holds
                s = old
            updated.append(s)
        if updated:
            self.servers = updated

    def drop(self, index: int) -> int:
        """Take server `index` out of the pool and cancel its requests in flight, which `complete` sends to the other
        servers at once (a server that stopped answering would hold them until rollout.request_timeout); returns
        how many were cancelled. The last server is kept: there is nowhere else to send its requests."""
        if not any(s.index != index for s in self.servers):
            return 0
        self.servers = [s for s in self.servers if s.index != index]
        calls = self._calls.pop(index, set())
        for call in calls:
            self._dropped.add(call)
            call.cancel()
        return len(calls)

    async def aclose(self) -> None:
        await self._client.aclose()

    def _pick(self, avoid: set[int], prefer: int | None = None) -> Server:
        candidates = [s for s in self.servers if s.index not in avoid] or self.servers
        preferred = [s for s in candidates if s.index == prefer]
        return preferred[0] if preferred else min(candidates, key=lambda s: (s.in_flight, s.failures, s.index))

    async def complete(self, prompt_ids: list[int], params: SamplingParams, *,
                       prefer: int | None = None) -> tuple[Server, list[Completion]]:
        """Sample `params.n` completions of a tokenized prompt; returns the server used and the completions.
        `prefer`: that server while it is in the pool and has not failed this request (a multi-turn episode stays
        where its earlier turns' tokens are in the prefix cache, and its log-prob check blames the right server)."""
        return await self._send(lambda server: backend_for(server.backend).complete(self._client, server, prompt_ids,
                                                                                    params),
                                lambda server, completions: check_completions(server, completions, params), prefer)

    async def pooling(self, ids: list[int], task: str) -> tuple[Server, list[float]]:
        """A pooling server's output for `ids` under `task` (a reward model: rlkit.rewards.model_reward)."""
        return await self._send(lambda server: backend_for(server.backend).pooling(self._client, server, ids, task),
                                lambda _server, values: values, None)

    async def _send(self, request: Callable[[Server], Awaitable[_T]], check: Callable[[Server, _T], _T],
                    prefer: int | None) -> tuple[Server, _T]:
        """`request` to the least-busy server (`prefer` first), its answer through `check`; a failed or silent
        attempt retried on another server, rollout.request_retries times."""
        async with self._limit:
            tried: set[int] = set()
            last_error: Exception | None = None
            errors: list[Exception] = []
            delay = self.retry_delay
            for _attempt in range(self.retries + 1):
                if tried and all(s.index in tried for s in self.servers):
                    # every server failed it: a burst of 503s or a restart may be passing. Waited before the pick,
                    # so the server is chosen from the pool as it is after the wait (drop or set_servers meanwhile)
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, MAX_RETRY_DELAY_S)
                server = self._pick(tried, prefer)
                tried.add(server.index)
                server.in_flight += 1
                call = asyncio.ensure_future(request(server))
                self._calls.setdefault(server.index, set()).add(call)
                try:
                    # the whole answer within the timeout: httpx's read timeout alone is per chunk, so a server
                    # trickling bytes would hold the request forever
                    answer = await asyncio.wait_for(call, self.timeout)
                    return server, check(server, answer)
                except asyncio.CancelledError:
                    if call not in self._dropped:
                        raise  # the rollout itself is cancelled, not this server's call
                    self._dropped.discard(call)
                    server.failures += 1
                    self.rerouted += 1
                    last_error = ServerSilent(f"server {server.index} ({server.address}) stopped answering")
                    errors.append(last_error)
                except TimeoutError:
                    server.failures += 1
                    self.rerouted += 1
                    last_error = TimeoutError(f"{server.label} sent no complete answer within {self.timeout:g} s "
                                              "(rollout.request_timeout)")
                    errors.append(last_error)
                except (httpx.HTTPError, KeyError, ValueError) as exc:
                    server.failures += 1
                    self.rerouted += 1
                    last_error = exc
                    errors.append(exc)
                    if isinstance(exc, SERVER_GONE_ERRORS) and len(self.servers) > 1:
                        # its process is gone: no more requests there (name resolve brings it back if restarted)
                        self.servers = [s for s in self.servers if s is not server]
                finally:
                    server.in_flight -= 1
                    self._calls.get(server.index, set()).discard(call)
            if all(isinstance(e, (*SERVER_GONE_ERRORS, ServerSilent)) for e in errors):
                raise ServersUnreachable(f"no inference server accepts connections ({self.retries + 1} attempts, "
                                         f"last: {type(last_error).__name__}: {last_error})")
            said = (f"; it answered {last_error.response.text[:300]!r}"
                    if isinstance(last_error, httpx.HTTPStatusError) else "")  # vLLM says why it refused
            raise StepError(f"a request failed {self.retries + 1} times (last on a server of {len(self.servers)}): "
                            f"{type(last_error).__name__}: {last_error}{said}")
