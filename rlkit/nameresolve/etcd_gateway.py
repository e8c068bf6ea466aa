"""The HTTP client of etcd's v3 JSON gateway, with one deadline for the whole answer of every call.

httpx's (and httpcore's) timeouts are per phase and per read: an etcd, or whatever answers at its address (a proxy),
that trickles a byte every few seconds would hold a call for as long as it trickles, and with it the lease keepalive
thread's lock, a server's registration or `rlkit status`. So requests go through httpcore with a network backend that
bounds every connect, TLS handshake, write and read by what is left of the calling thread's deadline: a call past it
fails naming the address, the path and the limit. The host name's lookup (getaddrinfo) has no timeout of its own
(the system resolver's: an unreachable DNS server or a stuck NSS module can hold it for minutes), so it runs in a
helper thread and the call waits for it only as long as its deadline allows; a lookup past it is left to end alone,
and the next call waits on that same lookup instead of starting another (no threads pile up while DNS hangs).
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import httpcore

from rlkit import untrusted_json
from rlkit.nameresolve.base import NameResolveError

_WRITE_CHUNK = 4096  # httpcore's write loops over partial sends, each with the timeout given: bound each chunk
_MAX_ANSWER = 64 << 20  # bytes: far above a trial's records; what answers at etcd's address may send without end
_TOKEN = re.compile(r"[\x21-\x7e]{1,4096}")  # an auth token goes into a header: printable ASCII, no spaces
# What a request fails with when etcd cannot be reached or answers something that is not HTTP (the timeouts apart).
_UNREACHABLE: tuple[type[Exception], ...] = (httpcore.NetworkError, httpcore.ProtocolError,
                                             httpcore.UnsupportedProtocol, httpcore.ProxyError)


@dataclass(frozen=True)
class EtcdTls:
    """TLS to etcd, as etcdctl's --cacert, --cert and --key: a CA bundle to verify the server, a client certificate."""

    cacert: str = ""
    cert: str = ""
    key: str = ""

    def context(self) -> ssl.SSLContext:
        """The TLS context of the client: the CA bundle (else the system's) and the client certificate, if any."""
        context = ssl.create_default_context(cafile=self.cacert or None)
        if self.cert:
            context.load_cert_chain(self.cert, self.key or None)
        return context


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's socket backend with every wait bounded by the deadline the calling thread set with `until`."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()
        self._local = threading.local()
        self._lookups = _Lookups()

    @contextmanager
    def until(self, deadline: float) -> Iterator[None]:
        self._local.deadline = deadline
        try:
            yield
        finally:
            self._local.deadline = None

    def left(self, timeout: float | None, expired: type[Exception]) -> float | None:
        """`timeout` cut to what is left of this thread's deadline; `expired` once it has passed."""
        deadline = getattr(self._local, "deadline", None)
        if deadline is None:
            return timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise expired("the deadline of the whole answer passed")
        return left if timeout is None else min(timeout, left)

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        """Connect to the first of `host`'s addresses that accepts, the lookup included within the deadline (TLS
        still checks the URL's host name: httpcore hands it to `start_tls` apart)."""
        options = list(socket_options or ())
        error: httpcore.ConnectError | None = None
        for address in self._lookups.addresses(host, port, self.left(timeout, httpcore.ConnectTimeout)):
            try:
                stream = self._inner.connect_tcp(address, port, self.left(timeout, httpcore.ConnectTimeout),
                                                 local_address, options)
            except httpcore.ConnectError as exc:  # refused or unreachable there: the next one, as create_connection
                error = exc
                continue
            return _DeadlineStream(stream, self)
        raise error or httpcore.ConnectError(f"the host name {host!r} has no address")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Lookups:
    """Host name lookups (getaddrinfo) with a deadline: each runs in a daemon thread; one past its caller's deadline
    runs on, and callers for the same name wait on it rather than start another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[tuple[str, int], tuple[threading.Event, dict[str, Any]]] = {}

    def addresses(self, host: str, port: int, timeout: float | None) -> list[str]:
        """`host`'s addresses (itself when it is one), in the resolver's order; httpcore.ConnectTimeout naming the
        name and the limit when the lookup outlives `timeout`, ConnectError when it fails."""
        try:
            ipaddress.ip_address(host)
            return [host]
        except ValueError:
            pass
        with self._lock:
            if (host, port) not in self._running:
                started: tuple[threading.Event, dict[str, Any]] = (threading.Event(), {})
                self._running[(host, port)] = started
                threading.Thread(target=self._look_up, args=(host, port, *started), daemon=True,
                                 name=f"rlkit-etcd-lookup {host[:64]}").start()
            done, box = self._running[(host, port)]
        if not done.wait(timeout):
            raise httpcore.ConnectTimeout(f"looking up the host name {host!r} took longer than {timeout:g} s (the "
                                          "system resolver: DNS, /etc/hosts, NSS); give etcd3_addr as an IP address "
                                          "to skip the lookup")
        if "error" in box:
            raise httpcore.ConnectError(f"cannot look up the host name {host!r}: {box['error']}")
        return cast("list[str]", box["addresses"])

    def _look_up(self, host: str, port: int, done: threading.Event, box: dict[str, Any]) -> None:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            box["addresses"] = list(dict.fromkeys(str(info[4][0]) for info in infos))
        except (OSError, UnicodeError) as exc:
            box["error"] = exc
        finally:
            with self._lock:
                self._running.pop((host, port), None)  # the next call looks up afresh (DNS may have changed)
            done.set()


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose reads, writes and TLS handshake end by the deadline of the thread using it."""

    def __init__(self, stream: httpcore.NetworkStream, backend: _DeadlineBackend) -> None:
        self._stream = stream
        self._backend = backend

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._backend.left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), _WRITE_CHUNK):
            self._stream.write(buffer[start:start + _WRITE_CHUNK], self._backend.left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        stream = self._stream.start_tls(ssl_context, server_hostname,
                                        self._backend.left(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(stream, self._backend)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class Gateway:
    """A thin client of the etcd v3 JSON gateway: https with a CA (and a client certificate) when given, and etcd's
    user/password authentication (a token in the Authorization header, fetched again when etcd says it expired).
    Each `call`, authentication included, gets its whole answer within `timeout` seconds or fails."""

    def __init__(self, url: str, timeout: float, *, tls: EtcdTls | None = None, user: str = "",
                 password: str = "") -> None:
        self.url = url
        self.timeout = float(timeout)
        self.user = user
        self.password = password
        self._token = ""
        self._base = url.rstrip("/")
        self._backend = _DeadlineBackend()
        self._pool = httpcore.ConnectionPool(ssl_context=(tls or EtcdTls()).context(),
                                             network_backend=self._backend)

    def close(self) -> None:
        self._pool.close()

    def _post(self, path: str, body: dict[str, Any]) -> tuple[int, str]:
        """POST `body` as JSON; the status and the answer, of which a stream (/v3/lease/keepalive: one JSON object
        per line, possibly never ending) is read only up to its first complete line."""
        first_line = path.endswith("keepalive")
        # without Accept, etcd answers a call lacking a user "permission denied", not "user name is empty" (the hint)
        headers = [(b"Content-Type", b"application/json"), (b"Accept", b"application/json")]
        if self._token:
            headers.append((b"Authorization", self._token.encode()))
        try:
            limit = self._backend.left(self.timeout, httpcore.PoolTimeout)
            timeouts = {"connect": limit, "read": limit, "write": limit, "pool": limit}
            with self._pool.stream("POST", self._base + path, headers=headers, content=json.dumps(body).encode(),
                                   extensions={"timeout": timeouts}) as resp:
                answer = bytearray()
                for chunk in resp.iter_stream():
                    answer += chunk
                    if first_line and b"\n" in answer.lstrip():
                        break
                    if len(answer) > _MAX_ANSWER:
                        raise NameResolveError(f"etcd at {self.url} answered more than {_MAX_ANSWER >> 20} MiB to "
                                               f"{path}: not etcd, or not well")
                status = resp.status
        except httpcore.TimeoutException as e:
            detail = f": {e}" if str(e).startswith("looking up") else ""
            raise NameResolveError(f"etcd at {self.url}: no complete answer to {path} within {self.timeout:g} s "
                                   f"(the name resolve's request timeout){detail}") from e
        except _UNREACHABLE as e:
            raise NameResolveError(f"cannot reach etcd at {self.url} ({path}): {type(e).__name__}: {e}") from e
        text = answer.decode("utf-8", "replace").strip()
        if first_line:
            text = text.split("\n", 1)[0].strip()
        return status, text

    def _json(self, path: str, text: str) -> dict[str, Any]:
        try:
            data = untrusted_json.loads(text) if text else {}
        except ValueError as e:
            raise NameResolveError(f"etcd at {self.url} answered {path} with something that is not JSON: "
                                   f"{text[:300]!r}") from e
        return data if isinstance(data, dict) else {}

    def _authenticate(self) -> None:
        path = "/v3/auth/authenticate"
        self._token = ""  # an expired token sent along would make etcd refuse the login itself
        status, text = self._post(path, {"name": self.user, "password": self.password})
        if status != 200:
            raise NameResolveError(f"etcd at {self.url} refused user {self.user!r} ({status}: {text[:1000]}); "
                                   "check cluster.name_resolve.etcd3_user and $ETCDCTL_PASSWORD")
        token = self._json(path, text).get("token")
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise NameResolveError(f"etcd at {self.url} answered {path} for user {self.user!r} without a usable "
                                   f"token: {text[:300]!r}")
        self._token = token

    def call(self, path: str, body: dict[str, Any], *, missing_ok: bool = False) -> dict[str, Any]:
        """etcd's answer to `path` (its "result" for a stream); NameResolveError naming etcd's address, the path and,
        past the deadline, the limit, if it is unreachable, slow, or answers an error."""
        with self._backend.until(time.monotonic() + self.timeout):
            if self.user and not self._token:
                self._authenticate()
            status, text = self._post(path, body)
            if status == 401 and self.user:  # the token expired (etcd's --auth-token-ttl): once more
                self._authenticate()
                status, text = self._post(path, body)
        if status != 200:
            if missing_ok and status == 404:
                return {}
            hint = ("; this etcd requires authentication: set cluster.name_resolve.etcd3_user and $ETCDCTL_PASSWORD"
                    if not self.user and "user name is empty" in text else "")
            raise NameResolveError(f"etcd at {self.url} answered {status} to {path}: {text[:1000]}" + hint)
        data = self._json(path, text)
        result = data.get("result", data)
        return result if isinstance(result, dict) else {}
