"""The guard's answer to the code's opens for writing on a kernel without Landlock (stdlib only; executed from the
spec's text like sandbox_seccomp.py). Why: a read-only mount does not stop writes into FIFOs and device nodes
(the kernel skips the mount's write check for special files), and before Landlock nothing unprivileged names them
by path. So the seccomp filter sends every open(2)/openat(2)/creat(2) for writing to the guard (seccomp user
notification, Linux >= 5.0; its "continue" answer, 5.5), which looks at what the path names, as the code would
reach it, and refuses (EACCES) a FIFO, a socket or a device node other than /dev/null, /dev/zero, /dev/full;
everything else continues into the kernel, whose own checks (read-only mounts, permissions) then apply.

The check cannot be raced: the code is single-threaded (RLIMIT_NPROC=1, no thread or process of its own to
change the path's memory or its scratch files while the call waits), and outside the scratch it can change
nothing. A FIFO of its own scratch is refused too."""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import stat
from collections.abc import Callable

SECCOMP_IOCTL_NOTIF_RECV, SECCOMP_IOCTL_NOTIF_SEND = 0xC0502100, 0xC0182101
SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1
EACCES, EINVAL = 13, 22
AT_FDCWD = -100
O_NOFOLLOW = 0o400000 if os.uname().machine == "x86_64" else 0o100000
CREAT_FLAGS = 0o1101  # creat(2): O_WRONLY | O_CREAT | O_TRUNC
PATH_MAX = 4096
MAX_LINKS = 40  # as the kernel's path walk (ELOOP past it)
TICK_MS = 20  # how often the runner's exit is checked when the kernel offers no pidfd (before 5.3)
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full")


class _Data(ctypes.Structure):
    _fields_ = [("nr", ctypes.c_int32), ("arch", ctypes.c_uint32), ("ip", ctypes.c_uint64),
                ("args", ctypes.c_uint64 * 6)]


class _Notif(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("data", _Data)]


class _Resp(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("val", ctypes.c_int64), ("error", ctypes.c_int32),
                ("flags", ctypes.c_uint32)]


def can_continue(libc: ctypes.CDLL, listener: int) -> bool:
    """Whether this kernel takes the "continue" answer (5.5): an answer to no notification is ENOENT there and
    EINVAL before (flags unknown)."""
    resp = _Resp(0, 0, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE)
    libc.ioctl(ctypes.c_int(listener), ctypes.c_ulong(SECCOMP_IOCTL_NOTIF_SEND), ctypes.byref(resp))
    return ctypes.get_errno() != EINVAL


def answer_opens(libc: ctypes.CDLL, listener: int, child: int, opens: dict[int, tuple[int | None, int, int | None]],
                 ) -> None:
    """Answer the listener's notifications until `child` (the runner) has exited; never reaps it. `opens`:
    sandbox_seccomp.OPENS of this machine (which argument is the dirfd, the path, the flags)."""
    allowed = {os.stat(device).st_rdev for device in WRITABLE_DEVICES if os.path.exists(device)}
    pipe = os.pipe()  # anonymous pipes (pipefs: its device): the code's own, e.g. /dev/stdout, may be reopened
    pipes = os.fstat(pipe[0]).st_dev
    for fd in pipe:
        os.close(fd)
    try:
        pidfd: int | None = os.pidfd_open(child)
    except (AttributeError, OSError):
        pidfd = None
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    try:
        while True:
            ready = {fd for fd, _ in poller.poll(None if pidfd is not None else TICK_MS)}
            if pidfd in ready or (pidfd is None and os.waitid(os.P_PID, child, os.WEXITED | os.WNOHANG | os.WNOWAIT)):
                return
            if listener in ready:
                _answer_one(libc, listener, opens, allowed, pipes)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _answer_one(libc: ctypes.CDLL, listener: int, opens: dict[int, tuple[int | None, int, int | None]],
                allowed: set[int], pipes: int) -> None:
    notif = _Notif()
    if libc.ioctl(ctypes.c_int(listener), ctypes.c_ulong(SECCOMP_IOCTL_NOTIF_RECV), ctypes.byref(notif)) != 0:
        return  # ENOENT: the caller was killed meanwhile
    error = _refusal(notif.pid, opens.get(notif.data.nr), list(notif.data.args), allowed, pipes)
    resp = _Resp(notif.id, 0, -error, 0 if error else SECCOMP_USER_NOTIF_FLAG_CONTINUE)
    libc.ioctl(ctypes.c_int(listener), ctypes.c_ulong(SECCOMP_IOCTL_NOTIF_SEND), ctypes.byref(resp))


def _refusal(pid: int, where: tuple[int | None, int, int | None] | None, args: list[int], allowed: set[int],
             pipes: int) -> int:
    """0 (continue) or the errno that refuses this open: what its path names, reached as the code would."""
    if where is None:
        return EACCES  # the filter sends only the calls of `opens`
    dirfd_at, path_at, flags_at = where
    path = _read_path(pid, args[path_at])
    if path is None:
        return EACCES
    flags = CREAT_FLAGS if flags_at is None else args[flags_at]
    dirfd = AT_FDCWD if dirfd_at is None else ctypes.c_int32(args[dirfd_at] & 0xFFFFFFFF).value
    if not path:
        return 0  # the kernel answers ENOENT itself
    if not path.startswith(b"/"):
        path = (f"/proc/{pid}/cwd/" if dirfd == AT_FDCWD else f"/proc/{pid}/fd/{dirfd}/").encode() + path
    try:
        resolved = as_runner_sees(pid, path, follow_last=not flags & O_NOFOLLOW)
        if resolved is None:
            return EACCES
        info = os.stat(resolved) if not flags & O_NOFOLLOW else os.lstat(resolved)
    except (FileNotFoundError, NotADirectoryError):
        return 0  # a new regular file, or the kernel's own error
    except OSError:
        return EACCES
    if stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode):
        return 0
    if stat.S_ISCHR(info.st_mode) and info.st_rdev in allowed:
        return 0
    if stat.S_ISFIFO(info.st_mode) and info.st_dev == pipes:  # not a FIFO of a file system: a pipe it holds
        return 0
    return EACCES


def as_runner_sees(pid: int, path: bytes, *, follow_last: bool) -> bytes | None:
    """`path` (absolute) as process `pid` reaches it, for the guard to stat: its symlinks resolved here, /proc's
    `self` and `thread-self` made `pid`'s (through a link too, e.g. /dev/fd -> /proc/self/fd: followed by the guard
    they would name the guard's own fds), procfs's magic links (fd/N, cwd, root) of `pid` kept for the kernel to
    follow, or, in the middle of the path, replaced by the directory they name. None: a path the guard cannot
    follow as `pid` would (too many links, a magic directory link whose name does not lead to it)."""
    proc = os.stat("/proc")
    pending = [part for part in reversed(path.split(b"/")) if part]
    done, links = b"", 0
    while links <= MAX_LINKS:
        if not pending:
            return done or b"/"
        name = pending.pop()
        if name in (b".", b""):
            continue
        if name == b"..":
            done = done.rpartition(b"/")[0]
            continue
        if name in (b"self", b"thread-self") and _same(done or b"/", proc):
            own = str(pid).encode()  # single-threaded: its one thread's id is its pid
            pending += [own] if name == b"self" else [own, b"task", own]  # (a stack: popped from the end)
            continue
        candidate = done + b"/" + name
        info = os.lstat(candidate)
        if not stat.S_ISLNK(info.st_mode) or (not pending and not follow_last):
            done = candidate
            continue
        if info.st_dev == proc.st_dev:  # a magic link of procfs: fd/N, cwd, root, exe, ...
            if not pending:
                return candidate  # stat follows it, as the kernel will for `pid`
            target = os.readlink(candidate)
            if not target.startswith(b"/") or not _same(target, os.stat(candidate)):
                return None
            done = target.rstrip(b"/")
            continue
        target, links = os.readlink(candidate), links + 1
        if target.startswith(b"/"):
            done = b""
        pending += [part for part in reversed(target.split(b"/")) if part]
    return None


def _same(path: bytes, info: os.stat_result) -> bool:
    try:
        other = os.stat(path)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (info.st_dev, info.st_ino)


def _read_path(pid: int, address: int) -> bytes | None:
    """The NUL-terminated path at `address` in the process's memory (page by page: the next may be unmapped)."""
    data = b""
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        while len(data) < PATH_MAX:
            where = address + len(data)
            chunk = os.pread(fd, 4096 - where % 4096, where)
            if not chunk:
                return None
            end = chunk.find(b"\0")
            if end >= 0:
                return data + chunk[:end]
            data += chunk
    except (OSError, OverflowError):
        return None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return None  # longer than PATH_MAX: the kernel refuses it too (ENAMETOOLONG)


def notification_works(libc: ctypes.CDLL, install: Callable[[ctypes.CDLL, list[tuple[int, int, int, int]]],
                                                            int | str]) -> str:
    """'' when this kernel gives a seccomp listener that takes the "continue" answer, else why not. Tried in a
    child of its own (a filter cannot be removed once installed); `install`: sandbox_seccomp.install_with_listener."""
    pid = os.fork()
    if pid == 0:
        listener = install(libc, [(0x06, 0, 0, 0x7FFF0000)])  # allow everything
        os._exit(0 if isinstance(listener, int) and can_continue(libc, listener) else 1)
    _, status = os.waitpid(pid, 0)
    return "" if status == 0 else "no seccomp user notification with its continue answer (Linux >= 5.5)"
