"""Scratch directories of engines whose serve step was killed before it could remove them (rlkit.servers.scratch).

Why: Slurm ends a step with SIGTERM, then SIGKILL after the site's KillWait; a serve step killed in between (a
cancelled job, a node's short KillWait, an out-of-memory kill) leaves its directory and the engine's sockets in the
node's /tmp. The next serve step of the same user on that node removes them. A directory is judged only when it
carries the owner file this module writes, is this user's own and not a link, and its owner ran on this host in this
process namespace (a process id means nothing elsewhere) and is gone: a live server's directory, another user's,
or one written on another host sharing the directory is never touched.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
from pathlib import Path

OWNER_FILE = ".rlkit-owner"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): with the pid, it names one
    process even after the pid is reused; None when no such process exists."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rfind(")") + 2 :].split()  # the name in parentheses may hold spaces
    return fields[19] if len(fields) > 19 else None


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "unknown"


def owner_line() -> str:
    """This process as an owner file records it: pid, start time, host, pid namespace."""
    pid = os.getpid()
    return f"{pid} {_start_time(pid)} {socket.gethostname()} {_pid_namespace()}\n"


def write_owner(directory: Path) -> None:
    """Record this process as the owner of `directory` (a scratch directory it made, mode 0700)."""
    fd = os.open(directory / OWNER_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(owner_line())


def _owner_gone(directory: Path) -> bool:
    """Whether `directory`'s recorded owner ran here and no longer runs; False whenever that cannot be told."""
    marker = directory / OWNER_FILE
    try:
        info = marker.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size > 4096:
            return False
        parts = marker.read_text().split()
    except (OSError, UnicodeDecodeError):
        return False
    if len(parts) != 4 or not parts[0].isdigit():
        return False
    pid, started, host, namespace = int(parts[0]), parts[1], parts[2], parts[3]
    if host != socket.gethostname() or namespace != _pid_namespace():
        return False
    return _start_time(pid) != started


def remove_stale(parent: Path, prefix: str = "rlkit-") -> list[Path]:
    """Remove this user's scratch directories in `parent` (named `prefix`...) whose owner is gone; returns them."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            continue
        path = Path(entry.path)
        if _owner_gone(path):
            shutil.rmtree(path, ignore_errors=True)  # links inside are removed, never followed
            if not path.exists():
                removed.append(path)
    return removed
