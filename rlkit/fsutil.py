"""fsync and rename helpers for crash-safe writes (weights, checkpoints)."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)


def fsync_path(path: Path) -> None:
    """fsync a file (or a directory) by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename into it is durable; a filesystem that refuses it is only logged."""
    try:
        fsync_path(path)
    except OSError:
        logger.debug("could not fsync directory %s", path)


def replace_dir(new: Path, final: Path) -> None:
    """Make directory `new` become `final`, replacing a `final` that exists, without a moment with neither on disk:
    rename the old one aside, rename the new one in, then delete the old one. A crash in between leaves the old one
    beside as `.<name>.old`; the next call puts it back first, so there is always one complete `final` or `.old`."""
    aside = final.with_name(f".{final.name}.old")
    if aside.exists():
        if final.exists():
            shutil.rmtree(aside)
        else:
            os.rename(aside, final)
    if final.exists():
        os.rename(final, aside)
    os.rename(new, final)
    fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def write_dir(out_dir: Path, fill: Callable[[Path], object], *, replace: bool = False,
              then: Callable[[Path], object] | None = None) -> Path:
    """Write directory `out_dir` in one step: `fill(tmp)` writes its files into a temporary directory beside it; each
    file is made readable by all (0644; the directory 0755: servers may run as another user on the shared filesystem)
    and fsynced, `then(tmp)` adds files that keep their own permissions, and the directory is renamed to `out_dir`
    (with `replace`, replacing an existing one: `replace_dir`; without it an existing `out_dir` is a
    `FileExistsError`: a weight version is written once). A failure leaves no temporary directory behind."""
    if out_dir.exists() and not replace:
        raise FileExistsError(f"{out_dir} already exists: weight versions are written once (remove it first)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        fill(tmp)
        for item in tmp.iterdir():
            item.chmod(0o644)
            fsync_path(item)
        if then is not None:
            then(tmp)
        tmp.chmod(0o755)
        fsync_dir(tmp)
        if replace:
            replace_dir(tmp, out_dir)
        else:
            os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(out_dir.parent)
    return out_dir


def own_directory(path: Path, *, fix_mode: bool = False) -> str | None:
    """Why `path` is not a directory of this user that no one else may write, or None once it is (created 0700 when
    absent). A name in a shared /tmp can be taken first by another user, who could then hand this user their files or
    replace this user's. `fix_mode`: group and other write permission on a directory of this user's is taken away
    rather than refused."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError as e:
        return f"it cannot be created: {e.strerror}"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        return "it is a link or not a directory"
    if info.st_uid != os.geteuid():
        return f"it is uid {info.st_uid}'s, not yours (uid {os.geteuid()})"
    if info.st_mode & 0o022:
        if not fix_mode:
            return f"others may write in it (mode {stat.S_IMODE(info.st_mode):o})"
        try:
            os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o022, follow_symlinks=False)
        except OSError as e:
            return f"its mode cannot be set: {e.strerror}"
    return None
