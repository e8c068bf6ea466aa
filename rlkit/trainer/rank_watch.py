"""Every trainer rank heart-beats one name-resolve entry and watches the others': a rank that stops (a stopped or
frozen process, a node in trouble) is named within recover.rank_silence_timeout, and the watching rank ends the step,
so the job restarts it from the last checkpoint. Without this the other ranks wait in their next collective for the
process group's timeout (30 min) while the allocation does nothing.

The heartbeat is a thread of the rank's process (rlkit.nameresolve's keepalive), so a rank busy in a long kernel or
a slow collective is not silent; a GPU that hangs inside a kernel is left to NCCL's own timeout. Entries carry the
Slurm run they belong to (job, step, requeue), so a record of an earlier run of the step never counts; a rank that
ended its loop marks its entry done, so nobody takes its exit for silence.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from rlkit import untrusted_json
from rlkit.nameresolve.base import NameResolve

PREFIX = "trainer/ranks"
POLL_S = 2.0


def rank_key(rank: int) -> str:
    return f"{PREFIX}/{rank}"


class RankWatch:
    """This rank's entry and the thread that watches the other ranks' (see the module docstring). `on_silent` gets
    the message before the process ends with exit code 1 (`end`: os._exit; tests pass their own)."""

    def __init__(self, nr: NameResolve, rank: int, world_size: int, run: str, timeout: float, *,
                 heartbeat_interval: float, end: Callable[[int], Any] = os._exit) -> None:
        self.nr, self.rank, self.world_size, self.run, self.timeout = nr, rank, world_size, run, timeout
        self.grace = 2 * heartbeat_interval + POLL_S  # an entry removed by something else is back by then
        self.on_silent: Callable[[str], None] | None = None
        self._end = end
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _entry(self, done: bool) -> str:
        return json.dumps({"run": self.run, "host": socket.gethostname(), "pid": os.getpid(), "done": done})

    def start(self) -> None:
        if self.world_size < 2:
            return
        self.nr.add(rank_key(self.rank), self._entry(False), replace=True, keepalive=True)
        self._thread = threading.Thread(target=self._watch, name="rlkit-rank-watch", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        """This rank's loop ended normally: its entry says so (and no longer needs a heartbeat); watching stops."""
        self._stop.set()
        if self._thread is not None:
            try:
                self.nr.add(rank_key(self.rank), self._entry(True), replace=True, keepalive=False)
            except Exception as exc:  # the run's end matters more; a watcher may then take this exit for silence
                print(f"rlkit train: rank {self.rank}: could not mark its name-resolve entry done: {exc}", flush=True)

    def stop(self) -> None:
        """Stop watching (the step is failing anyway: its exit, not a silent rank, is what happened)."""
        self._stop.set()

    def _entries(self) -> dict[int, dict[str, Any]]:
        found = {}
        for key, value in self.nr.list_subtree(PREFIX).items():
            try:
                entry = untrusted_json.loads(value)
                rank = int(key.rsplit("/", 1)[1])
            except (ValueError, IndexError):
                continue
            if isinstance(entry, dict) and entry.get("run") == self.run:
                found[rank] = entry
        return found

    def _watch(self) -> None:
        seen: dict[int, dict[str, Any]] = {}
        missing_since: dict[int, float] = {}
        while not self._stop.wait(POLL_S):
            try:
                live = self._entries()
            except Exception:  # a transient filesystem or etcd error: ask again at the next poll
                continue
            now = time.monotonic()
            seen.update(live)
            for rank in live:
                missing_since.pop(rank, None)
            silent = []
            for rank, entry in sorted(seen.items()):
                if rank == self.rank or rank in live or entry.get("done"):
                    continue
                if now - missing_since.setdefault(rank, now) > self.grace:
                    silent.append(rank)
            if silent and not self._stop.is_set():
                self._fail([(rank, seen[rank]) for rank in silent])
                return

    def _fail(self, silent: list[tuple[int, dict[str, Any]]]) -> None:
        named = ", ".join(f"rank {rank} (pid {e.get('pid')} on {e.get('host')})" for rank, e in silent)
        message = (f"trainer {named} silent for more than {self.timeout:g} s (recover.rank_silence_timeout): "
                   "stopped, frozen, or its node is in trouble; ending this step so that the job restarts it from "
                   "the last checkpoint")
        print(f"rlkit train: rank {self.rank}: {message}", flush=True)
        if self.on_silent is not None:
            try:
                self.on_silent(message)
            except Exception as exc:  # the exit matters more than the status line
                print(f"rlkit train: could not record it in progress.json: {exc}", flush=True)
        self._end(1)
