"""The trainer's answer to a stop signal: rank 0 rewrites the stop_ack file at once, from a thread woken by the
signal's C-level handler, so the answer does not wait for the main thread to come back from a long C call (a
collective, a save); `rlkit stop` waits for that answer before it waits for the checkpoint."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlkit.step_contract import EXIT_REQUEUE, EXIT_STOPPED
from rlkit.trainer.stop_requests import StopRequests


@pytest.fixture
def handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    wakeup = signal.set_wakeup_fd(-1)
    yield
    signal.set_wakeup_fd(wakeup)
    for s, handler in saved.items():
        signal.signal(s, handler)


def wait_for_text(path: Path, than: str = "", timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text and text != than:
            return text
        time.sleep(0.01)
    raise AssertionError(f"{path} was not (re)written within {timeout} s")


def test_rank_0_answers_each_signal(tmp_path: Path, handlers: None) -> None:
    ack = tmp_path / "stop_ack"
    stop = StopRequests(ack)
    os.kill(os.getpid(), signal.SIGUSR2)
    first = wait_for_text(ack)
    assert first.startswith(f"SIGUSR2 {os.getpid()} ") and stop.requested == EXIT_STOPPED
    os.kill(os.getpid(), signal.SIGUSR1)
    assert wait_for_text(ack, than=first).startswith("SIGUSR1 ")  # each answer differs from the last
    assert stop.requested == EXIT_REQUEUE


def test_the_answer_does_not_wait_for_the_main_thread_s_long_c_call(tmp_path: Path, handlers: None) -> None:
    """The main thread is inside one C call that runs no Python handler until it returns (pbkdf2 over millions of
    rounds, seconds); the signal sent meanwhile is answered before that call returns, the request itself after."""
    ack = tmp_path / "stop_ack"
    stop = StopRequests(ack)
    answered_at: list[float] = []

    def send_and_watch() -> None:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGUSR2)
        wait_for_text(ack, timeout=60)
        answered_at.append(time.monotonic())

    watcher = threading.Thread(target=send_and_watch)
    watcher.start()
    hashlib.pbkdf2_hmac("sha256", b"rlkit", b"salt", 5_000_000)  # one long C call (it releases the GIL)
    returned_at = time.monotonic()
    watcher.join()
    assert answered_at and answered_at[0] < returned_at, "the answer waited for the main thread"
    assert stop.requested == EXIT_STOPPED  # the Python handler ran once the call returned


def test_other_ranks_and_an_unwritable_trial_still_stop_after_the_step(tmp_path: Path, handlers: None) -> None:
    stop = StopRequests(None)
    os.kill(os.getpid(), signal.SIGUSR2)
    assert stop.requested == EXIT_STOPPED and not list(tmp_path.iterdir())
    signal.set_wakeup_fd(-1)
    stop = StopRequests(tmp_path / "gone" / "stop_ack")  # the write fails: the request stands
    os.kill(os.getpid(), signal.SIGUSR2)
    time.sleep(0.2)
    assert stop.requested == EXIT_STOPPED
