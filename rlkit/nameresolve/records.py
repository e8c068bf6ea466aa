"""The NFS store's record files: names, format, and the checks that keep out what another user could write.

The trainer sends the trial's bearer token to the address a server record names, so a record is only believed when
nobody but the current user could have written it: the record is a regular file (not a symlink, FIFO or device)
owned by us without group/other write permission, and every directory from the store's root down to it is owned
by us without group/other write permission (another user could otherwise rename or replace entries). Records are
created 0600 in 0700 directories. A record that fails a check is skipped with one warning naming the file and the
reason; it is never used and never crashes the reader.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import stat
import threading
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from rlkit import untrusted_json

log = logging.getLogger(__name__)

RECORD_SUFFIX = ".rec"
TMP_SUFFIX = ".tmp"
RECORD_FORMAT = 1
MAX_NAME_BYTES = 240  # NAME_MAX is 255; leave room for the suffix
MAX_RECORD_BYTES = 1 << 20  # a record is a few hundred bytes; anything this large is not one
_READ_RETRIES = 3
_GROUP_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def warn_once(what: str, reason: str) -> None:
    """Log that ``what`` is ignored because of ``reason``, once per process (readers poll every second)."""
    with _warned_lock:
        if (what, reason) in _warned:
            return
        _warned.add((what, reason))
    log.warning("rlkit name resolve: ignoring %s: %s", what, reason)


def encode_key(key: str) -> str:
    """File-name stem of ``key``: percent-encode, then '/' -> ':' (':' itself is always percent-encoded)."""
    return quote(key, safe="/").replace("/", ":")


def decode_key(stem: str) -> str:
    """Inverse of ``encode_key``."""
    key = stem.replace(":", "/")
    return unquote(key) if "%" in key else key


def untrusted_reason(st: os.stat_result, kind: str) -> str:
    """Why a file or directory with status ``st`` cannot be trusted ('' when it can)."""
    if kind == "directory" and not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if kind == "record" and not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_uid != os.getuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & _GROUP_OTHER_WRITE:
        return f"its mode {stat.S_IMODE(st.st_mode):04o} lets group or others write it"
    return ""


def directory_chain(root: str, directory: str) -> list[str]:
    """``root`` and every directory below it down to ``directory`` (which must lie under ``root``)."""
    chain = [root]
    rel = os.path.relpath(directory, root)
    if rel != ".":
        for part in rel.split(os.sep):
            chain.append(os.path.join(chain[-1], part))
    return chain


def untrusted_directory(root: str, directory: str) -> tuple[str, str] | None:
    """(path, reason) of the first directory from ``root`` down to ``directory`` another user could write, or None
    (also when one does not exist yet: there is nothing to read)."""
    for path in directory_chain(root, directory):
        try:
            reason = untrusted_reason(os.stat(path), "directory")
        except FileNotFoundError:
            return None
        if reason:
            return path, reason
    return None


def make_private_dirs(root: str, directory: str) -> None:
    """Create ``root`` and the directories below it down to ``directory`` as 0700 (the parents of ``root`` with the
    default mode), then raise PermissionError if any of them is one another user could write."""
    parent = os.path.dirname(root)
    if parent:
        os.makedirs(parent, exist_ok=True)
    for path in directory_chain(root, directory):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    bad = untrusted_directory(root, directory)
    if bad is not None:
        raise PermissionError(f"{bad[0]} cannot hold name-resolve records: {bad[1]}")


@dataclass(frozen=True)
class RawRecord:
    """The bytes of one record file, or why they must not be believed (``problem``)."""

    path: str
    data: bytes
    problem: str = ""


def read_raw(path: str) -> RawRecord | None:
    """The record file at ``path``, or None if it does not exist. Never follows a symlink, never blocks on a FIFO;
    retries ESTALE (the file was replaced while opened on NFS)."""
    for attempt in range(_READ_RETRIES):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                return RawRecord(path, b"", "it is a symbolic link")
            if e.errno == errno.ESTALE and attempt < _READ_RETRIES - 1:
                continue
            return RawRecord(path, b"", f"it cannot be opened ({e.strerror})")
        try:
            st = os.fstat(fd)
            problem = untrusted_reason(st, "record")
            if problem:
                return RawRecord(path, b"", problem)
            if st.st_size > MAX_RECORD_BYTES:
                return RawRecord(path, b"", f"it is {st.st_size} bytes, too large for a record")
            with os.fdopen(fd, "rb", closefd=False) as f:
                return RawRecord(path, f.read(MAX_RECORD_BYTES + 1))
        except OSError as e:
            if e.errno != errno.ESTALE or attempt == _READ_RETRIES - 1:
                return RawRecord(path, b"", f"it cannot be read ({e.strerror})")
        finally:
            os.close(fd)
    return None


def record_problem(raw: RawRecord) -> tuple[dict[str, Any] | None, str]:
    """(the record, '') or (None, why ``raw`` is not a trusted, well-formed record)."""
    if raw.problem:
        return None, raw.problem
    try:
        rec = untrusted_json.loads(raw.data)
    except ValueError:
        return None, "it is not a JSON record"
    if not isinstance(rec, dict) or not isinstance(rec.get("value"), str):
        return None, "it has no string 'value'"
    heartbeat = rec.get("heartbeat")
    if rec.get("keepalive") and (isinstance(heartbeat, bool) or not isinstance(heartbeat, (int, float))
                                 or not math.isfinite(heartbeat)):
        # Infinity would keep a dead owner's entry live for good, NaN make a live one look dead without a word
        return None, "it is a keepalive record without a finite numeric 'heartbeat'"
    return rec, ""


def parse(raw: RawRecord | None) -> dict[str, Any] | None:
    """The record in ``raw``, or None if absent, untrusted or malformed (the last two warned about once)."""
    if raw is None:
        return None
    rec, problem = record_problem(raw)
    if problem:
        warn_once(f"name-resolve record {raw.path}", problem)
    return rec


def token(rec: dict[str, Any] | None) -> str | None:
    """The owner token of a record: who wrote it (its heartbeat and deletion only touch its own record)."""
    owner = rec.get("owner") if rec else None
    return owner.get("token") if isinstance(owner, dict) else None


def owner_text(rec: dict[str, Any] | None) -> str:
    owner = rec.get("owner") if rec else None
    if not isinstance(owner, dict):
        return "owner unknown"
    return f"host {owner.get('hostname')} pid {owner.get('pid')} created {owner.get('created_at')}"


def dumps(rec: dict[str, Any]) -> bytes:
    return (json.dumps(rec, indent=1) + "\n").encode()


def write_tmp(directory: str, stem: str, data: bytes) -> str:
    """Write ``data`` to a new fsync'ed temp file (0600) in ``directory`` and return its path."""
    path = os.path.join(directory, f".{stem[:64]}.{os.getpid()}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        unlink_quiet(path)
        raise
    os.close(fd)
    return path


def unlink_quiet(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
