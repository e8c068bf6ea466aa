"""rlkit.trainer.rank_watch with two ranks on a real NFS name resolve (in this process, each rank its own instance,
as each rank process has): a rank whose heartbeat stops is named and the step ended; a rank that finished, a record
removed by something else and an earlier run's record are not silence."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rlkit.nameresolve.nfs import NfsNameResolve
from rlkit.trainer import rank_watch
from rlkit.trainer.rank_watch import RankWatch, rank_key

TIMEOUT, HEARTBEAT = 3.0, 0.5  # a false alarm needs a heartbeat 2.5 s late


class Ranks:
    def __init__(self, root: Path, run: str = "7.3.0") -> None:
        self.ended: list[int] = []
        self.said: list[str] = []
        self.nrs = [NfsNameResolve(root, ttl=TIMEOUT, heartbeat_interval=HEARTBEAT) for _ in range(2)]
        self.watches = [RankWatch(nr, rank, 2, run, TIMEOUT, heartbeat_interval=HEARTBEAT, end=self.ended.append)
                        for rank, nr in enumerate(self.nrs)]
        self.watches[0].on_silent = self.said.append
        for watch in self.watches:
            watch.start()

    def close(self) -> None:
        for watch, nr in zip(self.watches, self.nrs, strict=True):
            watch.stop()
            nr.close()


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rank_watch, "POLL_S", 0.1)


def wait_until(pred, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(pred())


def test_a_rank_whose_heartbeat_stops_is_named_and_the_step_ends(tmp_path: Path) -> None:
    ranks = Ranks(tmp_path)
    try:
        time.sleep(2 * TIMEOUT)
        assert ranks.ended == [], "two heart-beating ranks are not silent"
        ranks.nrs[1]._stop_heartbeat()  # what a SIGSTOPped or frozen rank 1 looks like
        stopped = time.monotonic()
        assert wait_until(lambda: ranks.ended == [1])  # rank 0's watch ended the process, with exit code 1
        assert time.monotonic() - stopped >= TIMEOUT  # not before the timeout
        assert len(ranks.said) == 1
        assert ranks.said[0].startswith(f"trainer rank 1 (pid {os.getpid()} on ")
        assert "silent for more than 3 s (recover.rank_silence_timeout)" in ranks.said[0]
    finally:
        ranks.close()


def test_a_finished_rank_a_removed_record_and_an_earlier_run_are_not_silence(tmp_path: Path) -> None:
    old = NfsNameResolve(tmp_path, ttl=TIMEOUT, heartbeat_interval=HEARTBEAT)
    old.add(rank_key(2), '{"run": "7.2.0", "done": false}', keepalive=True)  # an earlier run's third rank
    ranks = Ranks(tmp_path)
    try:
        time.sleep(0.5)
        old._stop_heartbeat()  # ... which dies: not this run's rank, never silence
        os.unlink(ranks.nrs[1].path_of(rank_key(1)))  # a scratch cleaner: written again by the next heartbeat
        time.sleep(2 * TIMEOUT)
        ranks.watches[1].finish()  # rank 1 ended its loop; its process exits (no heartbeat) while rank 0 saves
        ranks.nrs[1]._stop_heartbeat()
        time.sleep(2 * TIMEOUT)
        assert ranks.ended == [] and ranks.said == []
    finally:
        ranks.close()
        old.close()
