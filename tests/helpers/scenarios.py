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
# The session's background scenarios: one at a time at first, so that they spread over the whole run (two at a time
# from the start, measured in issue 27, kept both cores busy beside the first third of the suite, then ended, and the
# rest left a third of the CPU idle for its last 17 minutes); a second one as soon as the cores are idle for a while
# (IDLE_WIDEN: the foreground's short tests and Slurm waits leave gaps), and two at a time once the foreground is done
# (the first background test starts): one trial alone left about half of the two cores idle for the last 18 minutes of
# a 43-minute run (vmstat, session 17).
BACKGROUND_SIDE_BY_SIDE = 1
BACKGROUND_WIDENED = 2
IDLE_WIDEN = (0.35, 20.0)  # widen when over this fraction of the CPU was idle over this many seconds
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
        self._closed = threading.Event()
        self.envs: dict[str, Any] = {}  # what each background module's start_background returned, by module name

    def widen(self, by: int | None = None) -> None:
        """Let `by` more (all of the widened number when None) run side by side from now on (idempotent)."""
        with self._lock:
            extra = self._extra if by is None else min(by, self._extra)
            self._extra -= extra
        for _ in range(extra):
            self._slots.release()

    def widen_when_idle(self, idle_fraction: float, window_s: float,
                        cpu_times: Callable[[], tuple[int, int]] | None = None) -> None:
        """Widen by one each time over `idle_fraction` of the machine's CPU time was idle during the last `window_s`
        seconds (`cpu_times`: all and idle so far; /proc/stat's by default), until the widened number runs: a
        background thread that ends with the pool."""
        read = cpu_times or _cpu_times

        def watch() -> None:
            before = read()
            while not self._closed.wait(window_s):
                now = read()
                total, idle = now[0] - before[0], now[1] - before[1]
                before = now
                with self._lock:
                    if self._extra == 0:
                        return
                if total > 0 and idle / total > idle_fraction:
                    self.widen(by=1)

        threading.Thread(target=watch, name="scenario pool: widen when idle", daemon=True).start()

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
        self._closed.set()
        self._executor.shutdown(wait=True, cancel_futures=True)


def _cpu_times() -> tuple[int, int]:
    """The machine's CPU time so far, all and idle (iowait counted idle), in clock ticks (/proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return sum(fields[:8]), fields[3] + fields[4]


def start_used(pool: ScenarioPool, selected: list[str], uses: dict[str, tuple[str, ...]],
               scenarios: dict[str, Callable[..., Any]], *args: Any) -> None:
    """Start, in `pool`, the scenarios that the selected tests ride on (`uses`: test -> scenario names), each called
    with `args`: running only some tests (-k) starts only their trials."""
    wanted = {name for test in selected for name in uses[test]}
    for name, scenario in scenarios.items():
        if name in wanted:
            pool.start(name, lambda scenario=scenario: scenario(*args))


def trial_starter(uses: dict[str, tuple[str, ...]], scenarios: dict[str, Callable[..., Any]]) -> Callable[
        [ScenarioPool, list[str], Callable[[str], Any]], None]:
    """The `start_background` of a module whose scenarios each take the session's tiny model and tmp_path_factory:
    tests/conftest.py calls it before the session's first test, and the trials run beside the rest of the suite."""

    def start_background(pool: ScenarioPool, selected: list[str], fixture: Callable[[str], Any]) -> None:
        start_used(pool, selected, uses, scenarios, fixture("tiny_model_dir"), fixture("tmp_path_factory"))

    return start_background


@contextmanager
def scenario_pool(workers: int = SIDE_BY_SIDE, widened: int | None = None,
                  idle_widen: tuple[float, float] | None = None) -> Iterator[ScenarioPool]:
    pool = ScenarioPool(workers, widened)
    if idle_widen is not None:
        pool.widen_when_idle(*idle_widen)
    try:
        yield pool
    finally:
        pool.close()
