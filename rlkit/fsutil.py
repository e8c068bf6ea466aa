"""fsync and rename helpers for crash-safe writes (weights, checkpoints)."""

from __future__ import annotations

import logging
import os
import shutil
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
