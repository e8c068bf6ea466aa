"""`rlkit status TRIAL`'s server rows: every registered server is asked for its health at once, so servers that
accept a connection and never answer cost about one timeout in all, not one each, and each row keeps its own
answer."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from rlkit.cli.status import server_rows
from rlkit.nameresolve import NfsNameResolve, server_key

TIMEOUT_S = 1.0


@contextmanager
def silent_listener() -> Iterator[str]:
    """A TCP port that takes connections (the kernel completes them into the backlog) and never sends a byte: a
    hung server. The request is sent; only the answer never comes."""
    sock = socket.create_server(("127.0.0.1", 0), backlog=16)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def healthy_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def _record(index: int, address: str) -> str:
    return json.dumps({"index": index, "address": address, "backend": "vllm", "model": "/m", "node": f"n{index}",
                       "weight_version": 0})


def test_hung_servers_cost_one_timeout_and_each_row_keeps_its_answer(tmp_path: Path) -> None:
    with ExitStack() as stack, NfsNameResolve(tmp_path / "nr") as nr:
        hung = [stack.enter_context(silent_listener()) for _ in range(5)]
        alive = stack.enter_context(healthy_server())
        policy = [hung[0], hung[1], alive, hung[2], hung[3]]  # the live one between dead ones: order must hold
        for i, address in enumerate(policy):
            nr.add(server_key(i), _record(i, address))
        nr.add(server_key(0, "judge"), _record(0, hung[4]))
        t0 = time.monotonic()
        servers, auxiliary = server_rows(nr, ["judge"], {"2": 7}, TIMEOUT_S)
        elapsed = time.monotonic() - t0
    # asked side by side: about one timeout (asked one after another: five); room for a loaded machine's threads
    assert elapsed < 3.5 * TIMEOUT_S, f"{elapsed:.2f} s for 5 hung servers: asked one after another"
    assert [(s.index, s.address, s.healthy) for s in servers] == [
        (0, hung[0], False), (1, hung[1], False), (2, alive, True), (3, hung[2], False), (4, hung[3], False)]
    assert servers[2].weight_version == 7 and servers[0].weight_version == 0  # the trainer's verified version wins
    assert [(a.model, a.index, a.address, a.healthy) for a in auxiliary] == [("judge", 0, hung[4], False)]
