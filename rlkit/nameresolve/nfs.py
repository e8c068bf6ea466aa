"""Name resolve on a shared filesystem (NFS): one small JSON record file per key, standard library only.

Layout: every key of a trial is one file directly in ``<record_root>/<experiment>/<trial>/``, named after the key
with each '/' written as ':' and other unsafe characters percent-encoded (``servers/0`` -> ``servers:0.rec``), so
a prefix listing is one ``scandir`` of one directory and no directory is ever created or removed under a writer.
Temporary files start with '.' and end in ``.tmp``; readers ignore them.

Every write is atomic: the record goes to a temp file in the same directory, is fsync'ed, then ``os.replace``d
(or ``os.link``ed, for a create that must not clobber a live entry), so a reader sees the old or the new record
whole, never a torn one. A record holds the value and owner metadata (hostname, pid, created time) for humans.

Heartbeat design (keepalive entries). The owner's daemon thread rewrites the whole record (atomically, as above)
every ``heartbeat_interval`` seconds with ``heartbeat`` = the owner's ``time.time()``; a reader treats the entry
as gone once ``reader_now - heartbeat > ttl``. Why inside the record and not the file mtime:

* NFS attribute caching: ``stat()`` may return attributes cached for up to ``acregmax`` (60 s by default), so an
  mtime could look stale or fresh for a minute. Liveness is instead read from the file *contents*, and ``open()``
  on NFS revalidates the file (close-to-open consistency), so one open+read gives value and heartbeat together.
* Clock skew: the heartbeat is the owner node's wall clock compared with the reader node's. We ASSUME the nodes
  of one Slurm cluster are NTP-synchronised to well under ``ttl - heartbeat_interval`` (25 s with the defaults);
  a node whose clock runs that far behind would have its entries look dead, one that far ahead look alive longer.
* A heartbeat only refreshes a record that still carries this owner's token, so it never resurrects an entry
  someone else deleted or took over; a SIGKILLed or hung owner simply stops refreshing and its entry expires.

New files become visible to other nodes when their NFS client revalidates the directory (at the latest after
``acdirmax``, 60 s by default; ``open()`` of a known name revalidates at once); ``wait`` polls, so it only sees
an entry that late in the worst case. Mounting with ``lookupcache=positive`` avoids cached negative lookups.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

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

log = logging.getLogger(__name__)

RECORD_SUFFIX = ".rec"
TMP_SUFFIX = ".tmp"
RECORD_FORMAT = 1
_MAX_NAME_BYTES = 240  # NAME_MAX is 255; leave room for the suffix
_READ_RETRIES = 3
_CREATE_ATTEMPTS = 10


def encode_key(key: str) -> str:
    """File-name stem of ``key``: percent-encode, then '/' -> ':' (':' itself is always percent-encoded)."""
    return quote(key, safe="/").replace("/", ":")


def decode_key(stem: str) -> str:
    """Inverse of ``encode_key``."""
    key = stem.replace(":", "/")
    return unquote(key) if "%" in key else key


def _read_raw(path: str) -> bytes | None:
    """The file's bytes, or None if it does not exist. Retries ESTALE (the file was replaced while opened on NFS)."""
    for attempt in range(_READ_RETRIES):
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno != errno.ESTALE or attempt == _READ_RETRIES - 1:
                raise
    return None


def _parse(data: bytes | None) -> dict[str, Any] | None:
    """The record in ``data``, or None if absent or not a well-formed record."""
    if data is None:
        return None
    try:
        rec = json.loads(data)
    except ValueError:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("value"), str):
        return None
    if rec.get("keepalive") and not isinstance(rec.get("heartbeat"), (int, float)):
        return None
    return rec


def _token(rec: dict[str, Any] | None) -> str | None:
    owner = rec.get("owner") if rec else None
    return owner.get("token") if isinstance(owner, dict) else None


def _dumps(rec: dict[str, Any]) -> bytes:
    return (json.dumps(rec, indent=1) + "\n").encode()


def _write_tmp(directory: str, stem: str, data: bytes) -> str:
    """Write ``data`` to a new fsync'ed temp file in ``directory`` and return its path."""
    path = os.path.join(directory, f".{stem[:64]}.{os.getpid()}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quiet(path)
        raise
    os.close(fd)
    return path


def _unlink_quiet(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@dataclass
class _Owned:
    path: str
    stem: str
    record: dict[str, Any]


class _Keepalive:
    """The keepalive entries of one instance and the daemon thread that heartbeats them.

    Kept apart from ``NfsNameResolve`` so the thread does not keep the instance alive and a finalizer can
    deregister the entries when the instance is garbage-collected or the interpreter exits.
    """

    def __init__(self, directory: str, interval: float) -> None:
        self.directory = directory
        self.interval = interval
        self.lock = threading.RLock()  # held by every write that touches an owned key
        self.owned: dict[str, _Owned] = {}
        self.closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def track(self, key: str, owned: _Owned) -> None:
        self.owned[key] = owned
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="rlkit-nameresolve-heartbeat", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self.lock:
                if self._stop.is_set():
                    return
                for key, owned in list(self.owned.items()):
                    try:
                        self._refresh(key, owned)
                    except OSError as e:  # a transient NFS error must not kill the heartbeat
                        log.warning("name-resolve heartbeat of %r in %s failed: %s", key, self.directory, e)

    def _refresh(self, key: str, owned: _Owned) -> None:
        rec = dict(owned.record, heartbeat=time.time())
        tmp: str | None = _write_tmp(self.directory, owned.stem, _dumps(rec))
        try:
            current = _parse(_read_raw(owned.path))
            if _token(current) != _token(owned.record):
                del self.owned[key]
                log.warning(
                    "name-resolve entry %r in %s was deleted or replaced by another owner; stopping its heartbeat",
                    key,
                    self.directory,
                )
                return
            assert tmp is not None
            os.replace(tmp, owned.path)
            tmp = None
            owned.record = rec
        finally:
            if tmp is not None:
                _unlink_quiet(tmp)

    def stop_thread(self) -> None:
        """Stop heartbeating without touching the entries (what a dead owner looks like to readers)."""
        self._stop.set()
        with self.lock:  # wait for a heartbeat in progress to finish
            pass
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def shutdown(self) -> None:
        """Stop the heartbeat and delete the entries this instance still owns. Idempotent."""
        self.stop_thread()
        with self.lock:
            self.closed = True
            for key, owned in list(self.owned.items()):
                del self.owned[key]
                try:
                    if _token(_parse(_read_raw(owned.path))) == _token(owned.record):
                        _unlink_quiet(owned.path)
                except OSError as e:
                    log.warning("could not deregister name-resolve entry %r in %s: %s", key, self.directory, e)


class NfsNameResolve(NameResolve):
    """Name resolve in ``<record_root>/<experiment>/<trial>/`` on a filesystem shared by the job's nodes.

    ``ttl``: a keepalive entry whose heartbeat is older than this (as seen by the reader) is treated as gone.
    ``heartbeat_interval``: how often this instance refreshes its own keepalive entries; keep it well below the
    ``ttl`` of every reader. See the module docstring for the heartbeat design and its clock/NFS assumptions.
    """

    def __init__(
        self,
        record_root: str | Path,
        experiment: str,
        trial: str,
        *,
        ttl: float = 30.0,
        heartbeat_interval: float = 5.0,
    ) -> None:
        check_component("experiment", experiment)
        check_component("trial", trial)
        if not ttl > 0:
            raise ValueError(f"ttl must be > 0, got {ttl}")
        if not 0 < heartbeat_interval < ttl:
            raise ValueError(f"heartbeat_interval must be > 0 and < ttl ({ttl}), got {heartbeat_interval}")
        self.ttl = float(ttl)
        self.heartbeat_interval = float(heartbeat_interval)
        self.directory = os.path.join(os.path.abspath(os.fspath(record_root)), experiment, trial)
        self._hostname = socket.gethostname()
        self._ka = _Keepalive(self.directory, self.heartbeat_interval)
        self._finalizer = weakref.finalize(self, self._ka.shutdown)

    # -- paths and records ------------------------------------------------------------------------------------

    def _stem(self, key: str) -> str:
        stem = encode_key(validate_key(key))
        if len(stem.encode()) > _MAX_NAME_BYTES:
            raise ValueError(f"name-resolve key {key[:60]!r}... is too long ({len(stem)} bytes encoded)")
        return stem

    def path_of(self, key: str) -> str:
        """The record file of ``key`` (for debugging and error messages)."""
        return os.path.join(self.directory, self._stem(key) + RECORD_SUFFIX)

    def _live(self, rec: dict[str, Any] | None, now: float) -> bool:
        return rec is not None and (not rec.get("keepalive") or now - float(rec["heartbeat"]) <= self.ttl)

    def _new_record(self, key: str, value: str, keepalive: bool) -> dict[str, Any]:
        now = time.time()
        return {
            "format": RECORD_FORMAT,
            "key": key,
            "value": value,
            "keepalive": keepalive,
            "heartbeat": now if keepalive else None,
            "heartbeat_interval": self.heartbeat_interval if keepalive else None,
            "owner": {
                "hostname": self._hostname,
                "pid": os.getpid(),
                "created": now,
                "created_at": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
                "token": uuid.uuid4().hex,
            },
        }

    # -- API ----------------------------------------------------------------------------------------------------

    def add(self, key: str, value: str, *, replace: bool = False, keepalive: bool = False) -> None:
        """Atomically store ``value`` under ``key`` (see ``NameResolve.add``).

        An existing entry that is no longer live (expired keepalive) is taken over even when ``replace`` is False.
        """
        stem = self._stem(key)
        if not isinstance(value, str):
            raise TypeError(f"name-resolve value must be a str, got {type(value).__name__}")
        path = os.path.join(self.directory, stem + RECORD_SUFFIX)
        rec = self._new_record(key, value, keepalive)
        os.makedirs(self.directory, exist_ok=True)
        with self._ka.lock:
            if keepalive and self._ka.closed:
                raise NameResolveError(f"cannot add keepalive entry {key!r}: this name resolve is closed")
            tmp = _write_tmp(self.directory, stem, _dumps(rec))
            try:
                if replace:
                    os.replace(tmp, path)
                else:
                    self._create(key, tmp, path)
            finally:
                _unlink_quiet(tmp)
            self._ka.owned.pop(key, None)
            if keepalive:
                self._ka.track(key, _Owned(path=path, stem=stem, record=rec))

    def _create(self, key: str, tmp: str, path: str) -> None:
        """Link ``tmp`` to ``path`` unless a live entry is there; a stale one is taken over. Caller unlinks tmp."""
        for _ in range(_CREATE_ATTEMPTS):
            try:
                os.link(tmp, path)  # atomic create-if-absent, also on NFS
                return
            except FileExistsError:
                if os.stat(tmp).st_nlink >= 2:  # NFS: the link was made but its reply was lost
                    return
            data = _read_raw(path)
            if data is None:
                continue  # removed meanwhile: try again
            rec = _parse(data)
            if self._live(rec, time.time()):
                raise NameEntryExistsError(
                    f"name-resolve key {key!r} already has a live entry in {self.directory}/ ({_owner_text(rec)}); "
                    "pass replace=True to overwrite it"
                )
            # Stale: move it aside, and keep it gone only if what we moved is exactly what we judged stale.
            grave = os.path.join(self.directory, f".{uuid.uuid4().hex[:12]}.stale{TMP_SUFFIX}")
            try:
                os.rename(path, grave)
            except FileNotFoundError:
                continue
            try:
                moved = _read_raw(grave)
                if moved != data:  # refreshed or replaced after we read it: put it back unless taken again
                    with contextlib.suppress(FileExistsError):
                        os.link(grave, path)
            finally:
                _unlink_quiet(grave)
        raise NameResolveError(f"could not create name-resolve key {key!r} in {self.directory}/: too much contention")

    def _read_live(self, key: str) -> dict[str, Any] | None:
        rec = _parse(_read_raw(self.path_of(key)))
        return rec if self._live(rec, time.time()) else None

    def get(self, key: str) -> str:
        """The live value of ``key``; NameEntryNotFoundError if absent, expired or unreadable."""
        rec = self._read_live(key)
        if rec is None:
            raise NameEntryNotFoundError(f"no live name-resolve entry {key!r} in {self.directory}/")
        return str(rec["value"])

    def delete(self, key: str) -> None:
        """Remove ``key`` (even if expired); NameEntryNotFoundError if there is no record file."""
        path = self.path_of(key)
        with self._ka.lock:
            self._ka.owned.pop(key, None)
            try:
                os.unlink(path)
            except FileNotFoundError:
                raise NameEntryNotFoundError(f"no name-resolve entry {key!r} in {self.directory}/") from None

    def _scan(self, prefix: str) -> list[tuple[str, str]]:
        """(key, path) of every record file at or below ``prefix``."""
        stem_prefix = encode_key(prefix) if prefix else ""
        below = stem_prefix + ":"
        found: list[tuple[str, str]] = []
        try:
            it = os.scandir(self.directory)
        except FileNotFoundError:
            return found
        with it:
            for entry in it:
                name = entry.name
                if not name.endswith(RECORD_SUFFIX):
                    continue
                stem = name[: -len(RECORD_SUFFIX)]
                if stem_prefix and stem != stem_prefix and not stem.startswith(below):
                    continue
                found.append((decode_key(stem), entry.path))
        return found

    def list_subtree(self, prefix: str) -> dict[str, str]:
        """Live entries at or below ``prefix`` ('servers' matches 'servers' and 'servers/0', not 'serversX')."""
        prefix = normalize_prefix(prefix)
        now = time.time()
        out: dict[str, str] = {}
        for key, path in self._scan(prefix):
            rec = _parse(_read_raw(path))
            if self._live(rec, now) and key_in_subtree(key, prefix):
                assert rec is not None
                out[key] = rec["value"]
        return dict(sorted(out.items()))

    def clear_subtree(self, prefix: str) -> None:
        """Remove every record at or below ``prefix`` (live or not)."""
        prefix = normalize_prefix(prefix)
        with self._ka.lock:
            for key in [k for k in self._ka.owned if key_in_subtree(k, prefix)]:
                del self._ka.owned[key]
            for _, path in self._scan(prefix):
                _unlink_quiet(path)

    def close(self) -> None:
        """Stop heartbeats and delete this instance's keepalive entries (deregister). Idempotent."""
        self._finalizer()

    def _stop_heartbeat(self) -> None:
        """Stop heartbeating but leave the entries on disk: what a hung or killed owner looks like (for tests)."""
        self._ka.stop_thread()

    # -- diagnostics ---------------------------------------------------------------------------------------------

    def describe_location(self) -> str:
        return f"directory {self.directory}/"

    def diagnose(self, key: str) -> str:
        if not os.path.isdir(self.directory):
            return "that directory does not exist (is the shared filesystem mounted on this node?)"
        path = self.path_of(key)
        data = _read_raw(path)
        if data is not None:
            rec = _parse(data)
            if rec is None:
                return f"{path} exists but is not a readable record"
            if self._live(rec, time.time()):
                return f"{path} appeared just after the deadline"
            age = time.time() - float(rec["heartbeat"])
            return (
                f"{path} exists but its heartbeat is {age:.1f} s old (ttl {self.ttl:g} s), so its owner "
                f"({_owner_text(rec)}) looks dead"
            )
        keys = sorted(k for k, _ in self._scan(""))
        if not keys:
            return "the directory holds no entries"
        shown = ", ".join(repr(k) for k in keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
        return f"the directory holds {shown}"


def _owner_text(rec: dict[str, Any] | None) -> str:
    owner = rec.get("owner") if rec else None
    if not isinstance(owner, dict):
        return "owner unknown"
    return f"host {owner.get('hostname')} pid {owner.get('pid')} created {owner.get('created_at')}"
