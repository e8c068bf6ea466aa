"""The trainer's answer to a stop signal: its handler rewrites the stop_ack file at once (rank 0 only), before the
checkpoint after the current step; `rlkit stop` waits for that answer before it waits for the checkpoint."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from rlkit.step_contract import EXIT_REQUEUE, EXIT_STOPPED
from rlkit.trainer.loop import _StopRequests


@pytest.fixture
def handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_rank_0_answers_each_signal_at_once(tmp_path: Path, handlers: None) -> None:
    ack = tmp_path / "stop_ack"
    stop = _StopRequests(ack)
    os.kill(os.getpid(), signal.SIGUSR2)  # the handler runs at the next bytecode of this (the main) thread
    assert stop.requested == EXIT_STOPPED
    first = ack.read_text()
    assert first.startswith(f"SIGUSR2 {os.getpid()} ")
    os.kill(os.getpid(), signal.SIGUSR1)
    assert stop.requested == EXIT_REQUEUE
    assert ack.read_text().startswith("SIGUSR1 ") and ack.read_text() != first  # each answer differs from the last


def test_other_ranks_and_an_unwritable_trial_still_stop_after_the_step(tmp_path: Path, handlers: None) -> None:
    stop = _StopRequests(None)
    os.kill(os.getpid(), signal.SIGUSR2)
    assert stop.requested == EXIT_STOPPED and not list(tmp_path.iterdir())
    stop = _StopRequests(tmp_path / "gone" / "stop_ack")  # the write fails: the request stands
    os.kill(os.getpid(), signal.SIGUSR2)
    assert stop.requested == EXIT_STOPPED
