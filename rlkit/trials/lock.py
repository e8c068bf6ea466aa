"""One submission of a trial at a time: `rlkit submit`, `rlkit resume` and the stages of a run hold the trial's lock
from the check that no job of it is in Slurm until its new job is recorded, so that of two racing commands (two
resumes in the same second, a resume beside a submit --force) exactly one submits and the other is refused naming
the job that won. Two jobs on one trial directory lost steps of metrics and checkpoints (issue 45)."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlkit.errors import UserError
from rlkit.trials.records import state_dir

WAIT_S = 120.0  # a holder submits in seconds; past this, something is stuck (a hung sbatch, a dead NFS lock server)


def lock_path(trial_dir: Path) -> Path:
    """The trial's lock file, in the per-user state (the trial directory may not exist yet): one per trial
    directory, named by its path's digest; fcntl locks hold across login nodes that share it over NFS."""
    digest = hashlib.sha256(str(trial_dir.resolve()).encode()).hexdigest()[:24]
    return state_dir("locks") / f"{digest}.lock"


@contextmanager
def trial_lock(trial_dir: Path, *, wait_s: float = WAIT_S) -> Iterator[None]:
    """Hold the trial's lock (waiting up to `wait_s` for another rlkit command to release it). The file is never
    removed: removing a lock file others may wait on would let two holders in."""
    path = lock_path(trial_dir)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:  # a lock file of another user's, a directory in its place
        raise UserError(f"cannot open the lock {path} to submit {trial_dir}: {exc.strerror or exc}",
                        hint="set RLKIT_HOME to a directory of your own you may write (default ~/.rlkit)") from None
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):  # ENOLCK: no lock service (NFS without lockd)
                    raise UserError(f"cannot lock {path} to submit {trial_dir}: {exc.strerror or exc}",
                                    hint="the filesystem of RLKIT_HOME must support fcntl locks (NFS: lockd or "
                                    "NFSv4); or point RLKIT_HOME at one that does") from None
                if time.monotonic() >= deadline:
                    raise UserError(f"waited {wait_s:.0f} s for another rlkit command submitting {trial_dir}",
                                    hint="wait for it to end, then look at `rlkit status`") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
