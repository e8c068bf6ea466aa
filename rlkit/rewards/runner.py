"""Score completions with a reward function in worker processes, with a time limit per call.

Each call runs in a worker process (forkserver where available, else spawn: never fork, the trainer holds CUDA and
threads); a call past `timeout` has its worker killed and the next call starts a fresh one. Threads were rejected
because a thread stuck in user code cannot be stopped: every hang would keep a pool thread (and a core) busy for good.

A worker loads the function by reference (module:function, pickled) and, if the function has a `warmup()` attribute,
calls it before taking calls, so slow imports are not charged to the first call. `env` is added to the worker's
environment before the function is loaded (how a reward function finds the trial's auxiliary models: a forkserver
started earlier would not see the trainer's later changes to its own environment). Whatever goes wrong in a call (an
exception, a non-number or non-finite result, a timeout, a dead worker) scores 0.0 with an error string and is
counted; nothing is raised out of `score()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import os
import pickle
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

_START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
_MAX_ERROR_CHARS = 500
_SAID_FAILURES = 3  # failed calls whose error is printed before only every hundredth is


@dataclass(frozen=True)
class RewardOutcome:
    """One scored completion: `value` is 0.0 whenever `error` is set (a mix of functions, rlkit.rewards.mix: the
    weighted sum with the failed ones at 0.0); `timed_out` marks a call past the limit; `parts`: a mix's functions'
    own values, by name."""

    value: float
    error: str | None = None
    timed_out: bool = False
    parts: tuple[tuple[str, float], ...] = ()


def _short(text: str, limit: int = _MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _name(fn: Any) -> str:
    """The reward function as the config names it (module:function), for the log."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"the reward function {module}:{name}" if module and name else "the reward function"


def _describe(exc: BaseException) -> str:
    try:
        return _short(f"{type(exc).__name__}: {exc}")
    except Exception:  # a __str__ that raises
        return type(exc).__name__


def as_reward(value: object) -> float:
    """`value` as a finite float; TypeError for a non-number (a str too), ValueError for NaN or infinity."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise TypeError(f"the reward function returned {type(value).__name__} {_short(repr(value), 80)}, "
                        "expected a float")
    result = float(value)
    if not math.isfinite(result):
        raise ValueError(f"the reward function returned {result}, expected a finite float")
    return result


def _worker_main(conn: Connection, payload: bytes, env: dict[str, str]) -> None:
    """Worker process: load the function, say ready, then answer (prompt, completion, row) calls until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer, which closes the runner
    os.environ.update(env)
    try:
        fn = pickle.loads(payload)
        warmup = getattr(fn, "warmup", None)
        if callable(warmup):
            warmup()
    except Exception as exc:
        conn.send(("fatal", _describe(exc)))
        return
    conn.send(("ready", None))
    while True:
        try:
            prompt, completion, row = conn.recv()
        except EOFError:  # the runner closed or died
            return
        try:
            reply: tuple[str, Any] = ("ok", as_reward(fn(prompt, completion, row)))
        except Exception as exc:
            reply = ("error", _describe(exc))
        conn.send(reply)


class _Worker:
    """One worker process and the runner's end of its pipe."""

    def __init__(self, ctx: BaseContext, payload: bytes, env: dict[str, str]) -> None:
        self.conn, child = ctx.Pipe()
        self.process: BaseProcess = ctx.Process(  # type: ignore[attr-defined]
            target=_worker_main, args=(child, payload, env), name="rlkit-reward-worker", daemon=True)
        self.process.start()
        child.close()  # so the runner sees EOF when the worker dies
        self.killed = False

    def exit_status(self) -> str:
        if self.killed:
            return "killed by the runner"
        self.process.join(1.0)
        code = self.process.exitcode
        if code is None:
            return "still running"
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"

    def stop(self) -> None:
        with contextlib.suppress(ValueError):  # already closed
            self.process.kill()

    def kill(self) -> None:
        if self.killed:
            return
        self.killed = True
        self.conn.close()
        self.stop()
        self.process.join(5.0)
        with contextlib.suppress(ValueError):  # still running after SIGKILL + 5 s: left to the cleanup at exit
            self.process.close()


async def _readable(conn: Connection, timeout: float) -> bool:
    """Wait until `conn` has data (or EOF); False after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    fd = conn.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await asyncio.wait_for(ready, timeout)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)


def plain(text: str, limit: int) -> str:
    """`text` on one line of printable characters, cut to `limit` (a user's exception text goes to the log)."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class RewardRunner:
    """Calls `fn(prompt, completion, row)` in up to `workers` processes, each call limited to `timeout` seconds.

    `calls`, `errors` and `timeouts` count finished calls; a timed-out call counts in `timeouts` only; `succeeded`
    counts the calls without an error and `last_error` keeps the latest error (rlkit.rewards.failing: a function
    that fails on every call stops the trainer).
    """

    def __init__(self, fn: Any, timeout: float, workers: int = 4, *, startup_timeout: float = 120.0,
                 env: dict[str, str] | None = None) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        try:
            self._payload = pickle.dumps(fn)
        except Exception as exc:
            raise TypeError(f"the reward function {fn!r} cannot be pickled by reference, so it cannot be sent to "
                            f"worker processes ({exc}); define it with `def` at the top level of a module") from exc
        self.fn = fn
        self.env = dict(env or {})
        self.timeout = float(timeout)
        self.workers = workers
        self.startup_timeout = float(startup_timeout)
        self.calls = 0
        self.errors = 0
        self.timeouts = 0
        self.succeeded = 0  # its own counter: read from another thread, calls - errors could count a failure as one
        self.last_error: str | None = None
        self._ctx = multiprocessing.get_context(_START_METHOD)
        self._idle: list[_Worker] = []
        self._live: set[_Worker] = set()
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:  # a semaphore belongs to one event loop
            self._slots, self._slots_loop = asyncio.Semaphore(self.workers), loop
        return self._slots

    async def score(self, prompt: str, completion: str, row: dict[str, Any]) -> RewardOutcome:
        """The reward of one completion; problems give value 0.0 and an error, never an exception."""
        if self._closed:
            raise RuntimeError("RewardRunner.score() called after close()")
        async with self._semaphore():
            outcome = await self._score(prompt, completion, row)
        self.calls += 1
        if outcome.timed_out:
            self.timeouts += 1
        elif outcome.error is not None:
            self.errors += 1
        if outcome.error is None:
            self.succeeded += 1
        else:
            self.last_error = outcome.error
            self._say_failed(outcome.error)
        return outcome

    def _say_failed(self, error: str) -> None:
        """The first few failed calls in the log with their error, then every hundredth: the counts alone (metrics
        reward/errors, reward/timeouts) leave a user whose function raises on every row with rewards of 0.0 and no
        reason."""
        failed = self.errors + self.timeouts
        if failed <= _SAID_FAILURES or failed % 100 == 0:
            print(f"rlkit reward: {_name(self.fn)} failed on {failed} of {self.calls} calls so far, each scored 0.0; "
                  f"this one: {plain(error, 1000)}", flush=True)

    async def _score(self, prompt: str, completion: str, row: dict[str, Any]) -> RewardOutcome:
        try:
            request = pickle.dumps((prompt, completion, row))
        except Exception as exc:
            return RewardOutcome(0.0, f"the prompt, completion or row cannot be pickled for the worker: "
                                      f"{_describe(exc)}")
        worker = self._idle.pop() if self._idle else None
        reusable = False
        try:
            if worker is None:
                worker = _Worker(self._ctx, self._payload, self.env)
                self._live.add(worker)
                if not await _readable(worker.conn, self.startup_timeout):
                    return RewardOutcome(0.0, f"the reward worker did not start within {self.startup_timeout:g} s")
                kind, detail = worker.conn.recv()
                if kind != "ready":
                    return RewardOutcome(0.0, f"the reward worker could not load the reward function: {detail}")
            worker.conn.send_bytes(request)
            if not await _readable(worker.conn, self.timeout):
                return RewardOutcome(0.0, f"the reward function took longer than {self.timeout:g} s "
                                          "(reward.timeout); its worker was killed", timed_out=True)
            kind, detail = worker.conn.recv()
            reusable = True
            return RewardOutcome(float(detail)) if kind == "ok" else RewardOutcome(0.0, str(detail))
        except (EOFError, OSError) as exc:
            if worker is None:
                return RewardOutcome(0.0, f"could not start a reward worker: {_describe(exc)}")
            if self._closed:
                return RewardOutcome(0.0, "the runner was closed during the call")
            return RewardOutcome(0.0, f"the reward worker died ({worker.exit_status()}) during the call")
        except Exception as exc:
            return RewardOutcome(0.0, f"the reward worker failed: {_describe(exc)}")
        finally:
            if worker is not None:
                if reusable and not self._closed:
                    self._idle.append(worker)
                else:  # timed out, died, cancelled or closed: never reuse a worker that may be mid-call
                    self._live.discard(worker)
                    worker.kill()

    def close(self) -> None:
        """Kill the worker processes; calls in flight score 0.0 with an error, later calls raise RuntimeError."""
        self._closed = True
        for worker in self._idle:
            self._live.discard(worker)
            worker.kill()
        self._idle.clear()
        for worker in self._live:  # busy: the waiting call sees EOF and closes its own pipe (its fd is still watched)
            worker.stop()
