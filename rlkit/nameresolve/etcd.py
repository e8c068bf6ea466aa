"""Name resolve on etcd v3 through its JSON/HTTP gateway (``/v3/kv/*``, ``/v3/lease/*``): the client is
``rlkit.nameresolve.etcd_gateway``, where every call has one deadline for its whole answer (``request_timeout``).

Keys live under ``/<root>/<experiment>/<trial>/<key>``; values are the same JSON records as the NFS store (value plus
owner metadata). Keepalive entries are attached to one etcd lease per instance (TTL = ``ceil(ttl)`` seconds, etcd
may round it up to its minimum of about 2 s); a daemon thread renews the lease every ``heartbeat_interval`` seconds.
Expiry is etcd's: when the owner stops renewing, etcd deletes the keys itself, so there is no clock-skew assumption.
``close`` revokes the lease, which deletes every keepalive key of this instance at once.

Security: etcd has no per-user files, so whoever can reach etcd with write access can write this trial's keys. Use
etcd's TLS (``EtcdTls``: https with a CA, a client certificate) and user authentication (a token from
``/v3/auth/authenticate``, renewed when etcd reports it expired) so only you can; without them the store is open
to everyone on the network. Readers validate every server address either way (``rlkit.nameresolve.servers``).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
import weakref
from datetime import UTC, datetime
from typing import Any

from rlkit import untrusted_json
from rlkit.nameresolve.base import (
    NameEntryExistsError,
    NameEntryNotFoundError,
    NameResolve,
    NameResolveError,
    check_component,
    key_in_subtree,
    normalize_prefix,
    validate_key,
)
from rlkit.nameresolve.etcd_gateway import EtcdTls, Gateway

log = logging.getLogger(__name__)


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def prefix_range_end(prefix: bytes) -> bytes:
    """The etcd ``range_end`` that selects every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\x00"  # all keys


class _Lease:
    """The instance's lease and the daemon thread renewing it; apart from the instance so a finalizer can revoke."""

    def __init__(self, gateway: Gateway, ttl: int, interval: float) -> None:
        self.gateway = gateway
        self.ttl = ttl
        self.interval = interval
        self.lock = threading.Lock()
        self.lease_id: str | None = None
        self.closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> str:
        """The lease id, granting a lease (and starting the renewals) if there is none."""
        with self.lock:
            if self.closed:
                raise NameResolveError("cannot add a keepalive entry: this name resolve is closed")
            if self.lease_id is None:
                self.lease_id = str(self.gateway.call("/v3/lease/grant", {"TTL": self.ttl})["ID"])
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="rlkit-etcd-lease-keepalive", daemon=True)
                self._thread.start()
            return self.lease_id

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self.lock:
                lease_id = self.lease_id
                if lease_id is None or self._stop.is_set():
                    continue
                try:
                    result = self.gateway.call("/v3/lease/keepalive", {"ID": lease_id})
                except (NameResolveError, ValueError) as e:
                    log.warning("etcd lease keepalive failed: %s", e)
                    continue
                if int(result.get("TTL", 0)) <= 0:  # expired: etcd has already deleted its keys
                    log.error("etcd lease %s expired; its keepalive entries are gone", lease_id)
                    self.lease_id = None

    def stop_thread(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def shutdown(self) -> None:
        """Stop renewing and revoke the lease (deleting its keys). Idempotent."""
        self.stop_thread()
        with self.lock:
            self.closed = True
            lease_id, self.lease_id = self.lease_id, None
        try:
            if lease_id is not None:
                self.gateway.call("/v3/lease/revoke", {"ID": lease_id}, missing_ok=True)
        except NameResolveError as e:
            log.warning("could not revoke etcd lease %s (its keys expire with it): %s", lease_id, e)
        finally:
            self.gateway.close()


class Etcd3NameResolve(NameResolve):
    """Name resolve in etcd under ``/<root>/<experiment>/<trial>/``; ``addr`` is ``host:port`` or a URL."""

    def __init__(
        self,
        addr: str,
        experiment: str,
        trial: str,
        *,
        ttl: float = 30.0,
        heartbeat_interval: float = 5.0,
        root: str = "rlkit",
        request_timeout: float = 10.0,
        tls: EtcdTls | None = None,
        user: str = "",
        password: str = "",
    ) -> None:
        check_component("experiment", experiment)
        check_component("trial", trial)
        check_component("root", root)
        if not 0 < heartbeat_interval < ttl:
            raise ValueError(f"heartbeat_interval must be > 0 and < ttl ({ttl}), got {heartbeat_interval}")
        secure = tls is not None and (tls.cacert or tls.cert)
        self.url = addr if "://" in addr else f"{'https' if secure else 'http'}://{addr}"
        self.base = f"/{root}/{experiment}/{trial}/"
        self.ttl = float(ttl)
        self.heartbeat_interval = float(heartbeat_interval)
        self._gw = Gateway(self.url, request_timeout, tls=tls, user=user, password=password)
        self._lease = _Lease(self._gw, max(1, math.ceil(ttl)), heartbeat_interval)
        self._finalizer = weakref.finalize(self, self._lease.shutdown)

    def _full(self, key: str) -> str:
        return self.base + validate_key(key)

    def _record(self, key: str, value: str, lease_id: str | None) -> str:
        now = time.time()
        return json.dumps(
            {
                "format": 1,
                "key": key,
                "value": value,
                "keepalive": lease_id is not None,
                "lease": lease_id,
                "owner": {
                    "hostname": socket.gethostname(),
                    "pid": os.getpid(),
                    "created": now,
                    "created_at": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
                    "token": uuid.uuid4().hex,
                },
            }
        )

    @staticmethod
    def _value(raw: str) -> str:
        try:
            rec = untrusted_json.loads(raw)
        except ValueError:
            return raw  # written by another tool (etcdctl put): the raw value
        return rec["value"] if isinstance(rec, dict) and isinstance(rec.get("value"), str) else raw

    def add(self, key: str, value: str, *, replace: bool = False, keepalive: bool = False) -> None:
        """Store ``value``; create-if-absent is one etcd transaction, expiry comes from the lease."""
        full = self._full(key)
        if not isinstance(value, str):
            raise TypeError(f"name-resolve value must be a str, got {type(value).__name__}")
        lease_id = self._lease.acquire() if keepalive else None
        put: dict[str, Any] = {"key": _b64(full), "value": _b64(self._record(key, value, lease_id))}
        if lease_id is not None:
            put["lease"] = lease_id
        if replace:
            self._gw.call("/v3/kv/put", put)
            return
        txn = {
            "compare": [{"key": _b64(full), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": put}],
        }
        if not self._gw.call("/v3/kv/txn", txn).get("succeeded"):
            raise NameEntryExistsError(
                f"name-resolve key {key!r} already has a live entry in {self.describe_location()}; "
                "pass replace=True to overwrite it"
            )

    def get(self, key: str) -> str:
        """The live value of ``key``; NameEntryNotFoundError if absent (or its lease expired)."""
        kvs = self._gw.call("/v3/kv/range", {"key": _b64(self._full(key))}).get("kvs") or []
        if not kvs:
            raise NameEntryNotFoundError(f"no live name-resolve entry {key!r} in {self.describe_location()}")
        return self._value(_unb64(kvs[0].get("value", "")))

    def delete(self, key: str) -> None:
        """Remove ``key``; NameEntryNotFoundError if it is absent."""
        resp = self._gw.call("/v3/kv/deleterange", {"key": _b64(self._full(key))})
        if int(resp.get("deleted", 0)) == 0:
            raise NameEntryNotFoundError(f"no name-resolve entry {key!r} in {self.describe_location()}")

    def _range(self, prefix: str) -> dict[str, Any]:
        start = (self.base + prefix).encode()
        return {"key": _b64(start), "range_end": _b64(prefix_range_end(start))}

    def list_subtree(self, prefix: str) -> dict[str, str]:
        """Live entries at or below ``prefix`` (as a path), sorted by key."""
        prefix = normalize_prefix(prefix)
        kvs = self._gw.call("/v3/kv/range", self._range(prefix)).get("kvs") or []
        out: dict[str, str] = {}
        for kv in kvs:
            key = _unb64(kv["key"])[len(self.base) :]
            if key_in_subtree(key, prefix):
                out[key] = self._value(_unb64(kv.get("value", "")))
        return dict(sorted(out.items()))

    def clear_subtree(self, prefix: str) -> None:
        """Remove ``prefix`` and everything below it, in one transaction."""
        prefix = normalize_prefix(prefix)
        ops = [{"request_delete_range": self._range(prefix + "/" if prefix else "")}]
        if prefix:
            ops.append({"request_delete_range": {"key": _b64(self.base + prefix)}})
        self._gw.call("/v3/kv/txn", {"compare": [], "success": ops})

    def close(self) -> None:
        """Stop renewing the lease and revoke it, deleting this instance's keepalive entries. Idempotent."""
        self._finalizer()

    def _stop_heartbeat(self) -> None:
        """Stop renewing the lease without revoking it: what a killed owner looks like (for tests)."""
        self._lease.stop_thread()

    def describe_location(self) -> str:
        return f"etcd at {self.url} under {self.base}"
