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
        with pytest.raises(UserError, match="another rlkit command has been submitting"), \
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
