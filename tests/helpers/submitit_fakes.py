"""Fakes of submitit's Job for the single-function jobs' waits (rlkit.launch.single_jobs)."""

from __future__ import annotations

import threading


class QueuedForever:
    """A submitit job that never finishes: done() stays False, so submitit's own wait() (done() every second until
    True) and result() (which waits the same way) never return; `release` ends the wait thread after the test."""

    job_id = "4242"

    def __init__(self) -> None:
        self.release = threading.Event()

    def done(self, force_check: bool = False) -> bool:
        return self.release.is_set()

    def wait(self) -> None:  # submitit.core.core.Job.wait, a faster poll
        while not self.done():
            self.release.wait(0.05)

    def result(self) -> None:
        raise AssertionError("result() must not be reached for a job that is not done")
