"""The /health probes of rlkit.servers.health (rlkit status, the trainer waiting for its servers, a server step
waiting for its engine) and a new server's guard check end within their timeout when a server trickles its answer:
each byte comes well within httpx's per-chunk timeout, so before, the probe (and `rlkit status`) waited as long as
the server kept trickling. A local server trickles for 2 s and then stops, so that without the deadline these tests
fail instead of hanging."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rlkit.servers.backend import backend_for
from rlkit.servers.guard_check import GuardCheckFailed, prove_guard
from rlkit.servers.health import ServerNotHealthy, probe_health, wait_healthy


@pytest.fixture
def trickling() -> Iterator[str]:
    """host:port of a server whose /health is 200 with a body trickled a byte every 50 ms for 2 s."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "41")
            self.end_headers()
            try:
                for _ in range(40):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass  # the client gave up: what the deadline is for

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_trickling_health_answer_is_cut_at_the_timeout(trickling: str) -> None:
    started = time.monotonic()
    assert probe_health([trickling], timeout=0.3) == [False]
    assert time.monotonic() - started < 1.5


def test_waiting_for_a_trickling_server_ends_at_its_timeout_naming_why(trickling: str) -> None:
    started = time.monotonic()
    with pytest.raises(ServerNotHealthy, match=r"within 0\.4 s \(last: no complete answer within 0\.[34]\d* s\)"):
        wait_healthy(f"http://{trickling}", 0.4)
    assert time.monotonic() - started < 1.5


def test_the_guard_check_of_a_trickling_server_ends_at_its_timeout(trickling: str) -> None:
    started = time.monotonic()
    with pytest.raises(GuardCheckFailed, match=r"could not ask GET .*/is_paused without the token to check the "
                                               r"server's token guard \(no complete answer within 0\.3 s\)"):
        prove_guard(f"http://{trickling}", backend_for("vllm"), "t", timeout=0.3)
    assert time.monotonic() - started < 1.5


def test_a_host_name_lookup_that_hangs_does_not_hold_the_probe_past_its_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx asks the event loop to look a server's host name up; in the loop's default executor a lookup that the
    system resolver holds kept `asyncio.run` (and so `rlkit status`) waiting for it whatever the probe's timeout."""
    import socket

    real = socket.getaddrinfo
    release = threading.Event()

    def getaddrinfo(host: object, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if isinstance(name, str) and name.endswith(".slow.test"):
            release.wait(5)  # a resolver that hangs (for 5 s here: past the assertion's bound either way)
            host = "127.0.0.1"
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    try:
        start = time.monotonic()
        assert probe_health(["server.slow.test:9"], timeout=0.3) == [False]
        waited = time.monotonic() - start
    finally:
        release.set()
    assert waited < 2.0, f"the probe took {waited:.1f} s"


def test_probes_of_a_name_whose_lookup_hangs_share_one_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer probes its servers about once a second while it waits for them (rollout.setup_timeout): each
    probe of a name whose lookup the resolver holds waits on the one lookup under way, where each started a thread
    of its own that piled up for as long as the resolver hung; the answer, once it comes, reaches the next probe."""
    import socket

    real = socket.getaddrinfo
    release = threading.Event()
    calls: list[str] = []

    def getaddrinfo(host: object, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name.endswith(".stuck.test"):
            calls.append(name)
            release.wait(5)
            host = "127.0.0.1"
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    try:
        for _ in range(3):
            assert probe_health(["server.stuck.test:9"], timeout=0.1) == [False]
        assert calls == ["server.stuck.test"]
    finally:
        release.set()
    deadline = time.monotonic() + 2
    while any(t.name == "rlkit-health-lookup" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert probe_health(["server.stuck.test:9"], timeout=1.0) == [False]  # looked up afresh: port 9 refuses
    assert calls == ["server.stuck.test"] * 2
