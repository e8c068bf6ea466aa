"""fsync helpers for crash-safe writes (weights, checkpoints)."""

from __future__ import annotations

import logging
import os
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
