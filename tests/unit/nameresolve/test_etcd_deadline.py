"""Every etcd gateway call has one deadline for its whole answer: a stand-in HTTP server (plain sockets, in a thread)
that trickles its answer a byte at a time must not hold a call past the limit, and a keepalive stream that goes on
after its first line must not hold one either."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import pytest

from rlkit.nameresolve import NameResolveError, etcd_gateway
from rlkit.nameresolve.etcd import Etcd3NameResolve

LIMIT = 0.5  # the resolver's request_timeout (s)
MARGIN = 0.5  # what a loaded machine may add to it (a trickled answer without the deadline takes 3 s)
TRICKLE_S, TRICKLE_BYTES = 0.2, 15  # a byte per 0.2 s for 3 s: past the limit, then the answer is complete

Answer = Iterable[tuple[float, bytes]]  # (pause before, bytes to send)


def _head(length: int | None) -> bytes:
    size = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{size}\r\nConnection: close\r\n\r\n".encode()


def _body(path: str) -> bytes:
    """etcd's answer to `path` for a trial where key 'k' is 'v'."""
    if path == "/v3/kv/range":
        value = base64.b64encode(json.dumps({"value": "v"}).encode()).decode()
        return json.dumps({"kvs": [{"key": "", "value": value}]}).encode()
    if path == "/v3/kv/txn":
        return b'{"succeeded": true}'
    if path == "/v3/lease/keepalive":
        return b'{"result": {"ID": "7", "TTL": "5"}}\n'
    return b'{"ID": "7", "TTL": "5"}'


def normal(path: str) -> Answer:
    body = _body(path)
    yield 0.0, _head(len(body)) + body


def trickled_body(path: str) -> Answer:
    body = _body(path)
    yield 0.0, _head(len(body))
    for i in range(TRICKLE_BYTES):  # every answer is longer
        yield TRICKLE_S, body[i:i + 1]
    yield 0.0, body[TRICKLE_BYTES:]


def trickled_head(path: str) -> Answer:
    body = _body(path)
    yield 0.0, b"HTTP/1.1 200 OK\r\nX-Slow: "
    for _ in range(TRICKLE_BYTES):
        yield TRICKLE_S, b"a"
    yield 0.0, b"\r\n" + _head(len(body)).split(b"\r\n", 1)[1] + body


def endless_keepalive(path: str) -> Answer:
    """etcd's keepalive stream, going on with a line every 0.2 s after the first (for 3 s, then it ends)."""
    line = _body(path)
    yield 0.0, _head(None) + b"%x\r\n%s\r\n" % (len(line), line)
    for _ in range(TRICKLE_BYTES):
        yield TRICKLE_S, b"%x\r\n%s\r\n" % (len(line), line)
    yield 0.0, b"0\r\n\r\n"


class StandIn:
    """An HTTP server on 127.0.0.1 answering each request (one per connection, each in a thread) as `answer` says."""

    def __init__(self, answer: Callable[[str], Answer]) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._serve, daemon=True)]
        self.threads[0].start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.threads.append(threading.Thread(target=self._answer, args=(conn,), daemon=True))
            self.threads[-1].start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                for pause, data in self.answer(self._request(conn)):
                    if self.stop.wait(pause):
                        return
                    conn.sendall(data)
            except OSError:  # the client gave up
                pass

    @staticmethod
    def _request(conn: socket.socket) -> str:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(4096)
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        length = next(int(v) for k, _, v in (h.partition(":") for h in lines[1:]) if k.lower() == "content-length")
        while len(body) < length:
            body += conn.recv(4096)
        return lines[0].split()[1]

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(5)
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[str], Answer]], Etcd3NameResolve]]:
    made: list[tuple[StandIn, Etcd3NameResolve]] = []

    def start(answer: Callable[[str], Answer]) -> Etcd3NameResolve:
        server = StandIn(answer)
        made.append((server, Etcd3NameResolve(server.addr, "exp", "t", request_timeout=LIMIT, ttl=5.0,
                                              heartbeat_interval=4.0)))
        return made[-1][1]

    yield start
    for server, nr in made:
        server.close()
        nr.close()


OPERATIONS: dict[str, tuple[str, Callable[[Etcd3NameResolve], object]]] = {
    "get": ("/v3/kv/range", lambda nr: nr.get("k")),
    "add": ("/v3/kv/txn", lambda nr: nr.add("k", "v")),
    "add keepalive": ("/v3/lease/grant", lambda nr: nr.add("k", "v", keepalive=True)),
    "keepalive": ("/v3/lease/keepalive", lambda nr: nr._gw.call("/v3/lease/keepalive", {"ID": "7"})),
}


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_a_trickled_answer_fails_the_call_within_the_limit_naming_it(serve, operation: str) -> None:
    path, run = OPERATIONS[operation]
    nr = serve(trickled_body)
    start = time.monotonic()
    with pytest.raises(NameResolveError) as caught:
        run(nr)
    waited = time.monotonic() - start
    assert waited < LIMIT + MARGIN, f"{operation} waited {waited:.2f} s on a trickled answer"
    message = str(caught.value)
    assert nr.url in message and path in message and f"within {LIMIT:g} s" in message, message


def test_trickled_headers_fail_the_call_within_the_limit_too(serve) -> None:
    nr = serve(trickled_head)
    start = time.monotonic()
    with pytest.raises(NameResolveError, match=f"no complete answer to /v3/kv/range within {LIMIT:g} s"):
        nr.get("k")
    assert time.monotonic() - start < LIMIT + MARGIN


def test_a_normal_answer_still_works(serve) -> None:
    nr = serve(normal)
    nr.add("k", "v", keepalive=True)
    assert nr.get("k") == "v"
    assert nr._gw.call("/v3/lease/keepalive", {"ID": "7"}) == {"ID": "7", "TTL": "5"}


def test_the_call_after_a_timed_out_one_works(serve) -> None:
    answers = iter([trickled_body, normal])
    nr = serve(lambda path: next(answers)(path))
    with pytest.raises(NameResolveError, match="no complete answer"):
        nr.get("k")
    assert nr.get("k") == "v"


def test_an_answer_without_end_is_cut_at_the_size_limit(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(etcd_gateway, "_MAX_ANSWER", 1000)
    nr = serve(lambda path: [(0.0, _head(None))] + [(0.0, b"400\r\n" + b" " * 1024 + b"\r\n")] * 2000)
    with pytest.raises(NameResolveError, match=r"answered more than 0 MiB to /v3/kv/range"):
        nr.get("k")


def test_a_keepalive_stream_that_goes_on_after_its_first_line_returns_that_line(serve) -> None:
    nr = serve(endless_keepalive)
    start = time.monotonic()
    assert nr._gw.call("/v3/lease/keepalive", {"ID": "7"}) == {"ID": "7", "TTL": "5"}
    assert time.monotonic() - start < LIMIT + MARGIN  # at once, not when the stream ends (3 s)


@pytest.fixture
def slow_dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Host names under .slow.test resolve only once the returned event is set (a resolver that hangs); names under
    .fast.test resolve to 127.0.0.1 at once, those under .fail.test not at all; other names as the system does."""
    real = socket.getaddrinfo
    release = threading.Event()

    def getaddrinfo(host: object, port: object, *args: object, **kwargs: object) -> object:
        if isinstance(host, str) and host.endswith(".slow.test"):
            release.wait(30)
            host = "127.0.0.1"
        elif isinstance(host, str) and host.endswith(".fast.test"):
            host = "127.0.0.1"
        elif isinstance(host, str) and host.endswith(".fail.test"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, port, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield release
    release.set()  # the lookup threads left waiting end now


def test_a_host_name_lookup_that_hangs_fails_the_call_within_the_limit_naming_it(slow_dns: threading.Event) -> None:
    server = StandIn(normal)
    port = server.addr.rsplit(":", 1)[1]
    nr = Etcd3NameResolve(f"etcd.slow.test:{port}", "exp", "t", request_timeout=LIMIT, ttl=5.0, heartbeat_interval=4.0)
    try:
        for _ in range(2):  # the second call waits on the same lookup, within its own limit
            start = time.monotonic()
            with pytest.raises(NameResolveError) as caught:
                nr.get("k")
            waited = time.monotonic() - start
            assert waited < LIMIT + MARGIN, f"waited {waited:.2f} s on a hanging lookup"
            message = str(caught.value)
            assert "looking up the host name 'etcd.slow.test'" in message and f"within {LIMIT:g} s" in message, message
        assert sum(t.name.startswith("rlkit-etcd-lookup") for t in threading.enumerate()) == 1  # no pile-up
        slow_dns.set()  # the resolver answers at last: the next call connects
        deadline = time.monotonic() + 5
        while any(t.name.startswith("rlkit-etcd-lookup") for t in threading.enumerate()) and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        assert nr.get("k") == "v"
    finally:
        server.close()
        nr.close()


def test_a_host_name_that_resolves_connects_to_its_address(slow_dns: threading.Event) -> None:
    server = StandIn(normal)
    port = server.addr.rsplit(":", 1)[1]
    nr = Etcd3NameResolve(f"etcd.fast.test:{port}", "exp", "t", request_timeout=LIMIT, ttl=5.0, heartbeat_interval=4.0)
    try:
        assert nr.get("k") == "v"
    finally:
        server.close()
        nr.close()


def test_a_host_name_that_does_not_resolve_says_so(slow_dns: threading.Event) -> None:
    nr = Etcd3NameResolve("etcd.fail.test:2379", "exp", "t", request_timeout=LIMIT, ttl=5.0,
                          heartbeat_interval=4.0)
    try:
        with pytest.raises(NameResolveError, match=r"cannot look up the host name 'etcd\.fail\.test'.*Name or service"):
            nr.get("k")
    finally:
        nr.close()
