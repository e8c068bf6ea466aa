"""The keepalive entries of one NFS name-resolve instance and the daemon thread that heartbeats them."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from rlkit.nameresolve.records import dumps, make_private_dirs, parse, read_raw, token, unlink_quiet, write_tmp

log = logging.getLogger(__name__)


@dataclass
class Owned:
    path: str
    stem: str
    record: dict[str, Any]


class Keepalive:
    """The keepalive entries of one instance and the daemon thread that heartbeats them.

    Kept apart from ``NfsNameResolve`` so the thread does not keep the instance alive and a finalizer can
    deregister the entries when the instance is garbage-collected or the interpreter exits.
    """

    def __init__(self, record_root: str, directory: str, interval: float) -> None:
        self.record_root = record_root
        self.directory = directory
        self.interval = interval
        self.lock = threading.RLock()  # held by every write that touches an owned key
        self.owned: dict[str, Owned] = {}
        self.closed = False
        self.rewritten = 0  # entries found removed and written again (by `_refresh`)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def track(self, key: str, owned: Owned) -> None:
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

    def _refresh(self, key: str, owned: Owned) -> None:
        rec = dict(owned.record, heartbeat=time.time())
        raw = read_raw(owned.path)
        if raw is None:  # removed (a scratch cleaner, a quota script, `rm -rf`): the owner is alive, so write it again
            self._rewrite(key, owned, rec)
            return
        if token(parse(raw)) != token(owned.record):
            del self.owned[key]
            log.warning("name-resolve entry %r in %s was replaced by another owner; stopping its heartbeat", key,
                        self.directory)
            return
        tmp = write_tmp(self.directory, owned.stem, dumps(rec))
        try:
            os.replace(tmp, owned.path)
        except OSError:
            unlink_quiet(tmp)
            raise
        owned.record = rec

    def _rewrite(self, key: str, owned: Owned, rec: dict[str, Any]) -> None:
        """Create the owned entry again (its directory too) unless another owner created it meanwhile."""
        make_private_dirs(self.record_root, self.directory)
        tmp = write_tmp(self.directory, owned.stem, dumps(rec))
        try:
            os.link(tmp, owned.path)  # create-if-absent: never clobbers an entry someone else has just made
        except FileExistsError:
            if os.stat(tmp).st_nlink < 2:  # not ours (NFS: a lost reply to our own link leaves st_nlink at 2)
                del self.owned[key]
                log.warning("name-resolve entry %r in %s was replaced by another owner; stopping its heartbeat",
                            key, self.directory)
                return
        finally:
            unlink_quiet(tmp)
        owned.record = rec
        self.rewritten += 1
        log.warning("name-resolve entry %r in %s had been removed by something else; written again", key,
                    self.directory)

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
                    if token(parse(read_raw(owned.path))) == token(owned.record):
                        unlink_quiet(owned.path)
                except OSError as e:
                    log.warning("could not deregister name-resolve entry %r in %s: %s", key, self.directory, e)
