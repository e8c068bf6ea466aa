"""rlkit.trials.lock: one rlkit command at a time submits a trial; the other waits, and past its wait is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit.errors import UserError
from rlkit.trials.lock import lock_path, trial_lock

HOLD = """
import sys, time
from pathlib import Path
from rlkit.trials.lock import trial_lock
with trial_lock(Path(sys.argv[1])):
    Path(sys.argv[2]).touch()
    while not Path(sys.argv[3]).exists():
        time.sleep(0.05)
"""


def test_a_second_holder_waits_for_the_first_then_gets_the_lock(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLKIT_HOME", str(tmp_path / "home"))
    trial, held, release = tmp_path / "exp" / "t1", tmp_path / "held", tmp_path / "release"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(trial), str(held), str(release)],
                              env={**os.environ, "RLKIT_HOME": str(tmp_path / "home")})
    try:
        deadline = time.monotonic() + 60
        while not held.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held.exists(), "the other process never took the lock"
        with pytest.raises(UserError, match="waited 0 s for another rlkit command submitting"), \
                trial_lock(trial, wait_s=0.5):
            pass
        with trial_lock(tmp_path / "exp" / "t2", wait_s=0.5):  # another trial's lock is another lock
            pass
        release.touch()
        started = time.monotonic()
        with trial_lock(trial, wait_s=60):
            assert holder.wait(timeout=60) == 0
        assert time.monotonic() - started < 60
    finally:
        release.touch()
        holder.wait(timeout=60)
    assert lock_path(trial).is_file(), "the lock file stays: removing it would let two holders in"
    assert lock_path(trial) != lock_path(tmp_path / "exp" / "t2")


def test_a_resume_whose_trial_was_submitted_meanwhile_is_refused_naming_that_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the lock a resume holds the job it found ended; another in the index won the race, whatever a busy
    controller says of its state (scontrol failing reads as UNKNOWN, which is not active)."""
    from rlkit.launch.submit import _refuse_if_submitted_meanwhile
    from rlkit.trials.paths import TrialPaths
    from rlkit.trials.records import TrialRecord, record_trial

    monkeypatch.setenv("RLKIT_HOME", str(tmp_path / "home"))
    paths = TrialPaths(tmp_path / "exp" / "t1")
    record_trial(TrialRecord("exp", "t1", str(paths.root), "280", time.time()))
    _refuse_if_submitted_meanwhile(paths, "280")  # the same job: nobody came between
    record_trial(TrialRecord("exp", "t1", str(paths.root), "282", time.time()))
    with pytest.raises(UserError, match="exp/t1 was submitted again meanwhile, as job 282"):
        _refuse_if_submitted_meanwhile(paths, "280")
