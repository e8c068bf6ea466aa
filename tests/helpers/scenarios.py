"""Test helper (not a conftest): independent trials side by side on the dev cluster, in the background of the session.

An end-to-end scenario (submit, wait, inject a fault, wait for the end state) spends much of its wall time waiting:
on Slurm, on server start-up, on a requeue delay; and the rest of the suite often leaves one of the two cores idle
(one pytest process, one server starting). So a module whose tests only assert on what its scenarios left marks them
`background` (pytest.mark.background) and defines `start_background(pool, selected, fixture)` (`fixture`: a session
fixture's value by name): the session starts those scenarios before its first test (tests/conftest.py), in one
`ScenarioPool` that runs at most `workers` of them side by side in background threads, longest first; the
background tests run last, each waiting for the result of its own scenario. A scenario's failure (an assertion or a
timeout inside it) is raised again in its test. The number side by side is bounded because the machine is small
(2 cores, 24 GiB): a trial of the CPU demo holds two vLLM servers and two trainer ranks; in the background, one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

SIDE_BY_SIDE = 2  # trials of the CPU demo's shape at once; measured in the issue note of the suite-time work
# The session's background scenarios: one at a time while the foreground runs, so that they spread over the whole run
# (two at a time from the start, measured in issue 27, kept both cores busy beside the first third of the suite,
# then ended, and the rest left a third of the CPU idle for its last 17 minutes); two at a time once the foreground
# is done (the first background test starts): one trial alone left about half of the two cores idle for the last 18
# minutes of a 43-minute run (vmstat, session 17).
BACKGROUND_SIDE_BY_SIDE = 1
BACKGROUND_WIDENED = 2
WALL_TIMES: dict[str, float] = {}  # every scenario of the session: the terminal summary prints them (conftest)


class ScenarioPool:
    """Named scenarios run in background threads, at most `workers` at a time (`widened` once `widen` is called), in
    the order they were started."""

    def __init__(self, workers: int = SIDE_BY_SIDE, widened: int | None = None) -> None:
        most = max(workers, widened or workers)
        self._executor = ThreadPoolExecutor(max_workers=most, thread_name_prefix="scenario")
        self._slots = threading.Semaphore(workers)  # scenarios running now; the executor only queues
        self._extra = most - workers
        self._lock = threading.Lock()
        self._futures: dict[str, Future[Any]] = {}
        self.envs: dict[str, Any] = {}  # what each background module's start_background returned, by module name

    def widen(self) -> None:
        """Let the widened number run side by side from now on (idempotent)."""
        with self._lock:
            extra, self._extra = self._extra, 0
        for _ in range(extra):
            self._slots.release()

    def start(self, name: str, scenario: Callable[[], Any]) -> None:
        def timed() -> Any:
            with self._slots:  # the wall time counts from the scenario's start, not from its wait for a slot
                began = time.monotonic()
                try:
                    return scenario()
                finally:
                    WALL_TIMES[name] = time.monotonic() - began

        self._futures[name] = self._executor.submit(timed)

    def result(self, name: str, timeout: float = 3600) -> Any:
        """The scenario's return value, once it has finished; its exception if it raised one."""
        return self._futures[name].result(timeout=timeout)

    def close(self) -> None:
        """Drop the scenarios not started yet, wait for the running ones (each ends by its own timeouts)."""
        self._executor.shutdown(wait=True, cancel_futures=True)


@contextmanager
def scenario_pool(workers: int = SIDE_BY_SIDE, widened: int | None = None) -> Iterator[ScenarioPool]:
    pool = ScenarioPool(workers, widened)
    try:
        yield pool
    finally:
        pool.close()
