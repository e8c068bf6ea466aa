"""Which inference servers have stopped answering: a server whose process is stopped or frozen keeps its name-resolve
record (its step's own process heart-beats it) and accepts connections, so only asking it tells. The rollout
controller asks every server GET /health each LIVENESS_POLL_S (vLLM and SGLang answer it from their HTTP process,
also while the engine loads weights); one that has not answered for rollout.server_silence_timeout seconds is
silent: its requests in flight go to the other servers, its part of a push under way is dropped, and pushes skip it
until it answers again. What this sees is the server's front process: an engine process frozen behind a live HTTP
process is left to the requests' own timeouts.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from rlkit.servers.backend import Server

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 5.0


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


async def probe(client: httpx.AsyncClient, servers: list[Server]) -> dict[int, bool]:
    """GET /health of every server at once: index -> answered 200 within PROBE_TIMEOUT_S."""

    async def one(server: Server) -> bool:
        try:
            response = await client.get(f"http://{server.address}/health", timeout=PROBE_TIMEOUT_S)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    results = await asyncio.gather(*(one(s) for s in servers))
    return {s.index: ok for s, ok in zip(servers, results, strict=True)}
