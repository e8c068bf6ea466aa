"""Deadlines for waits that have none of their own: an NCCL broadcast on a CUDA stream, a rendezvous blocked in C.

A weight push must fail, naming what it waited for, when a server dies mid-transfer; NCCL's collectives would wait
until the job's time limit (the hang users of the peers report most). So a wait is turned into polling a completion
test (a gloo work handle's `is_completed`, a CUDA event's `query`) against a deadline, and on expiry the caller's
abort runs (the communicator is aborted, which also frees its peers) before the error is raised. One code path for
gloo and NCCL: what the CPU tests exercise over gloo is what guards the GPU path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")
_FIRST_POLL_S, _LAST_POLL_S = 0.0001, 0.01  # backoff: a fast collective is seen at once, a slow one costs no CPU


class DeadlineExceeded(TimeoutError):
    """A wait outlived its deadline; the communicator it waited on was aborted."""


def wait_until(done: Callable[[], bool], timeout_s: float, what: str, *,
               on_expiry: Callable[[], None] | None = None, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> float:
    """Poll `done` until it is true and return the seconds waited; after `timeout_s`, run `on_expiry` (best effort:
    its own failure is logged, not raised) and raise DeadlineExceeded naming `what`."""
    started = clock()
    pause = _FIRST_POLL_S
    while not done():
        waited = clock() - started
        if waited >= timeout_s:
            _expire(on_expiry, what)
            raise _exceeded(what, timeout_s)
        sleep(min(pause, max(timeout_s - waited, 0.0)))
        pause = min(pause * 2, _LAST_POLL_S)
    return clock() - started


def call_with_deadline(fn: Callable[[], T], timeout_s: float, what: str, *,
                       on_expiry: Callable[[], None] | None = None) -> T:
    """`fn()`'s result, or DeadlineExceeded after `timeout_s` (for a call that blocks in C, such as a rendezvous:
    it runs in a daemon thread that is left to end on its own, since a blocked C call cannot be interrupted)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"deadline: {what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        _expire(on_expiry, what)
        raise _exceeded(what, timeout_s)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]


def _exceeded(what: str, timeout_s: float) -> DeadlineExceeded:
    return DeadlineExceeded(f"{what}: not done after {timeout_s:g} s (the communicator was aborted)")


def _expire(on_expiry: Callable[[], None] | None, what: str) -> None:
    if on_expiry is None:
        return
    try:
        on_expiry()
    except Exception as exc:  # the abort of a broken communicator may fail in its own way; the deadline error counts
        logger.warning("aborting after %s timed out failed: %s", what, exc)
