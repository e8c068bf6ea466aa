"""A full disk (ENOSPC) or quota (EDQUOT) is named as such and not retried (rlkit.errors.disk_full): through the
real CLI on a full file system (a 64 KB tmpfs in a mount namespace of the test's own), and for the shapes it takes
in the trainer (an OSError, one raised from another error, one only quoted in a message, as
torch.distributed.checkpoint and safetensors pass it on)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.errors import NO_RETRY_EXIT, disk_full


def _raised_from(inner: BaseException) -> RuntimeError:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise RuntimeError("checkpoint failed") from exc
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize(("exc", "words"), [
    (OSError(errno.ENOSPC, "No space left on device", "/fileroot/t/weights/x"),
     "the disk is full (No space left on device) writing /fileroot/t/weights/x"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "the disk is full (Disk quota exceeded)"),
    (_raised_from(OSError(errno.ENOSPC, "No space left on device")), "the disk is full (No space left on device)"),
    (RuntimeError("rank 1: Error while serializing: I/O error: No space left on device (os error 28)"),
     "the disk is full (No space left on device): rank 1"),
])
def test_a_full_disk_is_named(exc: BaseException, words: str) -> None:
    assert (disk_full(exc) or "").startswith(words)


@pytest.mark.parametrize("exc", [OSError(errno.EACCES, "Permission denied"), ValueError("no space for a name"),
                                 _raised_from(KeyError("x"))])
def test_other_failures_are_not(exc: BaseException) -> None:
    assert disk_full(exc) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs in a mount namespace needs root (CI runs as root)")
def test_the_cli_says_the_disk_is_full_and_exits_with_the_no_retry_code(tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    rlkit = f"{sys.executable} -m rlkit"
    done = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {full} && "
                           f"{rlkit} tiny-model {full}/model"], capture_output=True, text=True, check=False)
    assert done.returncode == NO_RETRY_EXIT, done.stderr[-2000:]
    assert "failed: the disk is full (No space left on device)" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
