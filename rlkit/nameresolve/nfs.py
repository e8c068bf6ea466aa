"""Name resolve on a shared filesystem (NFS): one small JSON record file per key, standard library only.

Layout: every key of a trial is one file directly in its record directory (``<trial dir>/name_resolve/`` by default,
see ``rlkit.nameresolve.name_resolve_for``), private to the user (0700, records 0600, owner and modes checked on
every read: ``rlkit.nameresolve.records``), named after the key
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
* A heartbeat only refreshes a record that still carries this owner's token, so it never takes back an entry
  another owner took over; a SIGKILLed or hung owner simply stops refreshing and its entry expires. An entry that
  is gone altogether (a scratch cleaner or a quota script removed the file or the directory) while its owner lives
  is written again by the next heartbeat, directory included, without clobbering one created meanwhile.

New files become visible to other nodes when their NFS client revalidates the directory (at the latest after
``acdirmax``, 60 s by default; ``open()`` of a known name revalidates at once); ``wait`` polls, so it only sees
an entry that late in the worst case. Mounting with ``lookupcache=positive`` avoids cached negative lookups.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
import weakref
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
from rlkit.nameresolve.keepalive import Keepalive, Owned
from rlkit.nameresolve.records import (
    MAX_NAME_BYTES,
    RECORD_FORMAT,
    RECORD_SUFFIX,
    TMP_SUFFIX,
    decode_key,
    dumps,
    encode_key,
    make_private_dirs,
    owner_text,
    parse,
    read_raw,
    record_problem,
    unlink_quiet,
    untrusted_directory,
    warn_once,
    write_tmp,
)

log = logging.getLogger(__name__)

_CREATE_ATTEMPTS = 10


class NfsNameResolve(NameResolve):
    """Name resolve in ``<record_root>/<experiment>/<trial>/`` (or ``<record_root>/`` itself when experiment and
    trial are None) on a filesystem shared by the job's nodes.

    ``record_root`` and every directory below it must belong to the current user and be writable by nobody else
    (see ``rlkit.nameresolve.records``); a writer creates them 0700, a reader ignores them (with a warning) if not.
    ``ttl``: a keepalive entry whose heartbeat is older than this (as seen by the reader) is treated as gone.
    ``heartbeat_interval``: how often this instance refreshes its own keepalive entries; keep it well below the
    ``ttl`` of every reader. See the module docstring for the heartbeat design and its clock/NFS assumptions.
    """

    def __init__(
        self,
        record_root: str | Path,
        experiment: str | None = None,
        trial: str | None = None,
        *,
        ttl: float = 30.0,
        heartbeat_interval: float = 5.0,
    ) -> None:
        if (experiment is None) != (trial is None):
            raise ValueError("give both experiment and trial, or neither")
        parts = [] if experiment is None or trial is None else [check_component("experiment", experiment),
                                                               check_component("trial", trial)]
        if not ttl > 0:
            raise ValueError(f"ttl must be > 0, got {ttl}")
        if not 0 < heartbeat_interval < ttl:
            raise ValueError(f"heartbeat_interval must be > 0 and < ttl ({ttl}), got {heartbeat_interval}")
        self.ttl = float(ttl)
        self.heartbeat_interval = float(heartbeat_interval)
        self.record_root = os.path.abspath(os.fspath(record_root))
        self.directory = os.path.join(self.record_root, *parts)
        self._hostname = socket.gethostname()
        self._ka = Keepalive(self.record_root, self.directory, self.heartbeat_interval)
        self._finalizer = weakref.finalize(self, self._ka.shutdown)

    def _trusted_directory(self) -> bool:
        """Whether the record directory may be read: nobody else could have written it (else warned once)."""
        bad = untrusted_directory(self.record_root, self.directory)
        if bad is not None:
            warn_once(f"name-resolve directory {bad[0]}", bad[1])
        return bad is None

    # -- paths and records ------------------------------------------------------------------------------------

    def _stem(self, key: str) -> str:
        stem = encode_key(validate_key(key))
        if len(stem.encode()) > MAX_NAME_BYTES:
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
                "created_at": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
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
        try:
            make_private_dirs(self.record_root, self.directory)
        except PermissionError as e:
            raise NameResolveError(
                f"cannot store name-resolve key {key!r}: {e}; use a directory of your own that only you can write "
                "(by default rlkit keeps records in the trial directory)"
            ) from e
        with self._ka.lock:
            if keepalive and self._ka.closed:
                raise NameResolveError(f"cannot add keepalive entry {key!r}: this name resolve is closed")
            tmp = write_tmp(self.directory, stem, dumps(rec))
            try:
                if replace:
                    os.replace(tmp, path)
                else:
                    self._create(key, tmp, path)
            finally:
                unlink_quiet(tmp)
            self._ka.owned.pop(key, None)
            if keepalive:
                self._ka.track(key, Owned(path=path, stem=stem, record=rec))

    def _create(self, key: str, tmp: str, path: str) -> None:
        """Link ``tmp`` to ``path`` unless a live entry is there; a stale one is taken over. Caller unlinks tmp."""
        for _ in range(_CREATE_ATTEMPTS):
            try:
                os.link(tmp, path)  # atomic create-if-absent, also on NFS
                return
            except FileExistsError:
                if os.stat(tmp).st_nlink >= 2:  # NFS: the link was made but its reply was lost
                    return
            data = read_raw(path)
            if data is None:
                continue  # removed meanwhile: try again
            rec = parse(data)
            if self._live(rec, time.time()):
                raise NameEntryExistsError(
                    f"name-resolve key {key!r} already has a live entry in {self.directory}/ ({owner_text(rec)}); "
                    "pass replace=True to overwrite it"
                )
            # Stale: move it aside, and keep it gone only if what we moved is exactly what we judged stale.
            grave = os.path.join(self.directory, f".{uuid.uuid4().hex[:12]}.stale{TMP_SUFFIX}")
            try:
                os.rename(path, grave)
            except FileNotFoundError:
                continue
            try:
                moved = read_raw(grave)
                # refreshed or replaced after we read it: put it back unless taken again
                if moved is None or moved.data != data.data:
                    with contextlib.suppress(FileExistsError):
                        os.link(grave, path)
            finally:
                unlink_quiet(grave)
        raise NameResolveError(f"could not create name-resolve key {key!r} in {self.directory}/: too much contention")

    def _read_live(self, key: str) -> dict[str, Any] | None:
        if not self._trusted_directory():
            return None
        rec = parse(read_raw(self.path_of(key)))
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
        if not self._trusted_directory():
            return out
        for key, path in self._scan(prefix):
            rec = parse(read_raw(path))
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
                unlink_quiet(path)

    def close(self) -> None:
        """Stop heartbeats and delete this instance's keepalive entries (deregister). Idempotent."""
        self._finalizer()

    def _stop_heartbeat(self) -> None:
        """Stop heartbeating but leave the entries on disk: what a hung or killed owner looks like (for tests)."""
        self._ka.stop_thread()

    # -- diagnostics ---------------------------------------------------------------------------------------------

    def describe_entry(self, key: str) -> str:
        return f"name-resolve record {self.path_of(key)}"

    def describe_location(self) -> str:
        return f"directory {self.directory}/"

    def diagnose(self, key: str) -> str:
        if not os.path.isdir(self.directory):
            return "that directory does not exist (is the shared filesystem mounted on this node?)"
        bad = untrusted_directory(self.record_root, self.directory)
        if bad is not None:
            return f"{bad[0]} is ignored because {bad[1]}"
        path = self.path_of(key)
        data = read_raw(path)
        if data is not None:
            rec, problem = record_problem(data)
            if rec is None:
                return f"{path} is ignored because {problem}"
            if self._live(rec, time.time()):
                return f"{path} appeared just after the deadline"
            age = time.time() - float(rec["heartbeat"])
            return (
                f"{path} exists but its heartbeat is {age:.1f} s old (ttl {self.ttl:g} s), so its owner "
                f"({owner_text(rec)}) looks dead"
            )
        keys = sorted(k for k, _ in self._scan(""))
        if not keys:
            return "the directory holds no entries"
        shown = ", ".join(repr(k) for k in keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
        return f"the directory holds {shown}"

