"""Which inference servers have stopped answering: a server whose process is stopped or frozen may keep its
name-resolve record (its step's own process heart-beats it) and accepts connections, so only asking it tells. The
rollout controller asks every server it has seen GET /health each LIVENESS_POLL_S, at its latest address, also once
its record has expired (a frozen step stops heart-beating too) or while a removed record is being written again
(vLLM answers /health from its HTTP process, also while the engine loads weights; SGLang too, as rlkit starts it:
rlkit.servers.sglang.backend). One that has not answered for rollout.server_silence_timeout seconds is silent: its
requests in flight go to the other servers, its part of a push under way is dropped, and pushes skip it until it
answers again. What this sees is the server's front process: an engine process frozen behind a live HTTP process is
left to the requests' own timeouts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import httpx

from rlkit.nameresolve.servers import http_url
from rlkit.servers.backend import Server
from rlkit.servers.http import ServerUnreachable
from rlkit.servers.pool import ServerPool
from rlkit.servers.tls import shared_tls

PROBE_TIMEOUT_S = 5.0
T = TypeVar("T")


class SilenceWatch:
    """The last answer of each server and the set of servers silent now (by index)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.last_answer: dict[int, float] = {}
        self.silent: set[int] = set()
        self.silenced = 0  # times a server was found silent, over the run

    def update(self, answers: dict[int, bool], now: float | None = None) -> tuple[list[int], list[int]]:
        """Record one round of probes (index -> answered); returns (servers silent from now on, servers back)."""
        now = time.monotonic() if now is None else now
        fell, back = [], []
        for index, answered in answers.items():
            if answered:
                self.last_answer[index] = now
                if index in self.silent:
                    self.silent.discard(index)
                    back.append(index)
                continue
            since = self.last_answer.setdefault(index, now)
            if index not in self.silent and now - since > self.timeout:
                self.silent.add(index)
                self.silenced += 1
                fell.append(index)
        return fell, back


async def probe(client: httpx.AsyncClient, addresses: dict[int, str]) -> dict[int, bool]:
    """GET /health at every address (server index -> host:port) at once: index -> answered 200 within
    PROBE_TIMEOUT_S (the whole answer: httpx's timeout is per chunk, and one server trickling its answer would hold
    the round, and with it the watch over every server)."""

    async def one(address: str) -> bool:
        try:
            response = await asyncio.wait_for(client.get(f"{http_url(address)}/health", timeout=PROBE_TIMEOUT_S),
                                              PROBE_TIMEOUT_S)
        except (httpx.HTTPError, TimeoutError):
            return False
        return response.status_code == 200

    indices = sorted(addresses)
    results = await asyncio.gather(*(one(addresses[i]) for i in indices))
    return dict(zip(indices, results, strict=True))


class ServerWatch:
    """The rollout controller's watch over its servers (on the controller's event loop): each round probes them,
    takes the ones found silent out of the pool (their requests in flight go elsewhere) and out of any push under
    way (`guard`), and says so in the trainer's log."""

    def __init__(self, timeout: float) -> None:
        self.silence = SilenceWatch(timeout)
        self._client: httpx.AsyncClient | None = None
        self.known: dict[int, str] = {}  # every server seen: index -> its latest address
        self._push_calls: dict[int, set[asyncio.Future[Any]]] = {}  # server index -> its parts of a push under way
        self._left_out: set[asyncio.Future[Any]] = set()  # push parts cancelled because their server went silent

    async def listen(self, live: list[Server], pool: ServerPool | None) -> None:
        """One round over the servers registered now (`live`) and those of `pool`."""
        if self._client is None:
            self._client = httpx.AsyncClient(trust_env=False, verify=shared_tls())
        for server in pool.servers if pool is not None else []:
            self.known.setdefault(server.index, server.address)
        self.known.update({s.index: s.address for s in live})  # a restarted server: its new address
        addresses = dict(self.known)
        fell, back = self.silence.update(await probe(self._client, addresses))
        for index in fell:
            moved = pool.drop(index) if pool is not None else 0
            for call in self._push_calls.pop(index, set()):
                self._left_out.add(call)
                call.cancel()
            print(f"rlkit train: server {index} ({addresses[index]}) has not answered /health for "
                  f"{self.silence.timeout:g} s (rollout.server_silence_timeout): {moved} requests in flight go to the "
                  "other servers; weight pushes skip it until it answers again", flush=True)
        for index in back:
            print(f"rlkit train: server {index} ({addresses[index]}) answers again; it takes requests once it "
                  "holds the current weights", flush=True)

    async def guard(self, server: Server, call: Awaitable[T]) -> T:
        """Run one server's part of a weight push until it ends or the server is found silent: ServerUnreachable
        then, so the push goes on without it instead of waiting out actor.weight_update_timeout."""
        gone = (f"{server.label}: has not answered /health for {self.silence.timeout:g} s "
                "(rollout.server_silence_timeout); left out of this push")
        if server.index in self.silence.silent:
            close = getattr(call, "close", None)
            if close is not None:
                close()  # never started: no "was never awaited" warning
            raise ServerUnreachable(gone)
        task = asyncio.ensure_future(call)
        self._push_calls.setdefault(server.index, set()).add(task)
        try:
            return await task
        except asyncio.CancelledError:
            if task not in self._left_out:
                raise  # the push itself is cancelled (its timeout, the end of the run)
            raise ServerUnreachable(gone) from None
        finally:
            self._push_calls.get(server.index, set()).discard(task)
            self._left_out.discard(task)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
