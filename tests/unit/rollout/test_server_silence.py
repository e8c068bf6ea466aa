"""rlkit.rollout.silence: when a server that stopped answering /health counts as silent, and when it is back."""

from __future__ import annotations

import pytest

from rlkit.rollout.silence import SilenceWatch


def test_a_server_is_silent_once_it_has_not_answered_for_the_timeout_and_back_at_its_next_answer() -> None:
    watch = SilenceWatch(timeout=30.0)
    assert watch.update({0: True, 1: True}, now=0.0) == ([], [])
    assert watch.update({0: True, 1: False}, now=20.0) == ([], [])  # 20 s without an answer: not yet
    assert watch.update({0: True, 1: False}, now=30.0) == ([], [])  # exactly the timeout: not yet
    assert watch.update({0: True, 1: False}, now=31.0) == ([1], [])
    assert watch.update({0: True, 1: False}, now=40.0) == ([], [])  # said once
    assert watch.silent == {1} and watch.silenced == 1
    assert watch.update({0: True, 1: True}, now=45.0) == ([], [1])
    assert watch.silent == set()


def test_a_server_first_seen_silent_gets_the_whole_timeout() -> None:
    watch = SilenceWatch(timeout=10.0)
    assert watch.update({2: False}, now=100.0) == ([], [])  # a restarted server, not answering yet
    assert watch.update({2: False}, now=109.0) == ([], [])
    assert watch.update({2: False}, now=111.0) == ([2], [])


def test_servers_are_asked_at_their_last_address_after_their_records_vanish() -> None:
    """A scratch cleaner removed both records (the listing is empty for a while): server 0 still answers at its
    address and stays in service; server 1's address answers nothing (a frozen step whose record then expired) and
    is found silent once the timeout passed."""
    import asyncio
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from rlkit.rollout.silence import ServerWatch
    from rlkit.servers.backend import Server
    from rlkit.servers.pool import ServerPool

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    servers = [Server(index=0, address=f"127.0.0.1:{httpd.server_address[1]}", model="m", backend="vllm"),
               Server(index=1, address="127.0.0.1:9", model="m", backend="vllm")]
    watch = ServerWatch(timeout=0.5)

    async def rounds() -> list[str]:
        pool = ServerPool(list(servers), "token", timeout=5.0, retries=1, max_in_flight=2)
        await watch.listen(servers, pool)  # both registered
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            await watch.listen([], pool)  # no record listed any more
            await asyncio.sleep(0.1)
        await pool.aclose()
        await watch.aclose()
        return [s.address for s in pool.servers]

    try:
        left = asyncio.run(rounds())
    finally:
        httpd.shutdown()
    assert watch.silence.silent == {1}
    assert left == [servers[0].address]  # server 1 dropped from the pool, server 0 kept


def test_a_server_trickling_its_health_answer_counts_as_not_answering(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each byte comes well within httpx's per-chunk timeout: only a deadline on the whole answer ends the probe,
    which otherwise held the round (and the watch over every other server) as long as the server kept trickling."""
    import asyncio
    import time
    from collections.abc import AsyncIterator

    import httpx

    from rlkit.rollout import silence

    async def trickle() -> AsyncIterator[bytes]:
        for _ in range(40):  # 2 s, then the end: without the deadline the test fails instead of hanging
            await asyncio.sleep(0.05)
            yield b" "

    def handler(request: httpx.Request) -> httpx.Response:
        slow = request.url.host == "slow"
        return httpx.Response(200, content=trickle() if slow else b"ok")

    async def main() -> dict[int, bool]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await silence.probe(client, {0: "slow:1", 1: "good:1"})

    monkeypatch.setattr(silence, "PROBE_TIMEOUT_S", 0.15)
    started = time.monotonic()
    assert asyncio.run(main()) == {0: False, 1: True}
    assert time.monotonic() - started < 1.5
