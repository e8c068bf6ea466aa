"""The stop requests a trainer rank takes between steps: USR1 (Slurm's time-limit warning) and USR2 (`rlkit stop`),
each asking for a checkpoint and an exit after the step, and rank 0's early answer to `rlkit stop`."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

from rlkit.step_contract import EXIT_REQUEUE, EXIT_STOPPED
from rlkit.trials.records import write_atomic


class StopRequests:
    """USR1 (Slurm's time-limit warning) and USR2 (`rlkit stop`) ask for a checkpoint and an exit after this step.
    On rank 0 (`ack` set) the signal is also answered at once by rewriting the stop_ack file, from a thread: `rlkit
    stop` learns that the trainer lives (a stopped or frozen rank 0 never answers, and is cancelled without a wait).
    The Python handler runs only once the main thread is back in Python, which a long C call (a collective, a save)
    can delay by minutes; the C-level handler writes each signal's number to the wakeup fd at once, where the
    thread reads it."""

    def __init__(self, ack: Path | None) -> None:
        self.requested: int | None = None
        self.ack = ack
        signal.signal(signal.SIGUSR1, self._handler)
        signal.signal(signal.SIGUSR2, self._handler)
        self._answers = ack is not None and self._answer_from_a_thread()

    def _handler(self, signum: int, _frame: object) -> None:
        self.requested = EXIT_REQUEUE if signum == signal.SIGUSR1 else EXIT_STOPPED
        print(f"rlkit train: got {signal.Signals(signum).name}: checkpoint after this step, then exit", flush=True)
        if not self._answers:
            self._answer(signum)

    def _answer(self, signum: int) -> None:
        if self.ack is not None:
            with contextlib.suppress(OSError):  # the checkpoint still comes; only the early answer is lost
                write_atomic(self.ack, f"{signal.Signals(signum).name} {os.getpid()} {time.time()!r}\n")

    def _answer_from_a_thread(self) -> bool:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        try:
            signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except ValueError:  # not the main thread (a test): the handler answers
            os.close(read_fd)
            os.close(write_fd)
            return False

        def answer() -> None:
            while data := os.read(read_fd, 64):
                for signum in data:
                    if signum in (signal.SIGUSR1, signal.SIGUSR2):
                        self._answer(signum)

        threading.Thread(target=answer, name="rlkit-stop-answer", daemon=True).start()
        return True
