"""The code tool's attacks on kernel objects its limits do not count and on host objects shared between runs
(issue 47), for tests/helpers/code_attacks.py: System V IPC, POSIX message queues, memfd_secret, the scratch's
inodes and xattrs, a host FIFO, a host device node, ptys and the user's terminal (write and TIOCSTI), file locks on
host files, inotify on host directories, kill(0), signals to the job user's other processes by every call that
sends one. Each attack says through its output what it got; the bait (a 0666 FIFO with a reader, a pty pair
standing for the user's terminal, a lock file) is looked at from outside afterwards.

The host device node (a 0666 copy of /dev/urandom outside /dev, as a site's copy of a GPU's node would be) needs
CAP_MKNOD, which a non-root probe lacks: the test makes it and names it in RLKIT_ATTACK_DEVICE; run by hand as
root, the probe makes its own."""

from __future__ import annotations

import os
import pty
import stat
import tty
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.agent.sandbox_mounts import scratch_inodes

CTYPES = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


@dataclass
class HostBait:
    fifo: Path  # 0666, held open for reading by the probe
    fifo_reader: int
    terminal: Path  # the slave of a pty pair of the probe's user (as the user's own terminal)
    master: int
    slave: int  # raw mode, so that pushed input is readable at once
    lock_file: Path  # 0644
    device: Path  # a 0666 character device outside /dev (urandom's numbers: writing it harms nothing)
    own_device: bool  # made by this probe: removed by close()

    def nothing_from(self, fd: int) -> bool:
        try:
            return not os.read(fd, 4096)
        except BlockingIOError:
            return True

    def close(self) -> None:
        for fd in (self.fifo_reader, self.master, self.slave):
            os.close(fd)
        if self.own_device:
            self.device.unlink(missing_ok=True)


def make_host_bait(root: Path) -> HostBait:
    fifo = root / "fifo"
    os.mkfifo(fifo)
    fifo.chmod(0o666)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    master, slave = pty.openpty()
    tty.setraw(slave)
    os.set_blocking(master, False)
    os.set_blocking(slave, False)
    lock_file = root / "job.lock"
    lock_file.write_text("")
    lock_file.chmod(0o644)
    named = os.environ.get("RLKIT_ATTACK_DEVICE")
    device = Path(named) if named else root / "urandom"
    if not named:
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 9))
        device.chmod(0o666)
    if not stat.S_ISCHR(device.stat().st_mode):
        raise ValueError(f"{device} is not a character device")
    return HostBait(fifo, reader, Path(os.ttyname(slave)), master, slave, lock_file, device, not named)


def _count(label: str, call: str, undo: str = "") -> str:
    """Code that makes up to 4 objects with `call` (a libc.syscall expression), prints how many it got, and
    removes them again with `undo` (format field {i}) where they outlive the run (no IPC namespace)."""
    return CTYPES + (f"got = [i for i in ({call} for _ in range(4)) if i >= 0]\nprint('{label}', len(got))\n"
                     + (f"for i in got:\n    {undo}\n" if undo else ""))


# every call that sends a signal, aimed at a process of the job's user outside the run (signal 0: permission
# checked, nothing delivered), and SIGIO redirected to it (F_SETOWN); each success prints "sent"
SIGNALS = CTYPES + """import fcntl, signal
v = {victim}
calls = {{"kill": lambda: libc.kill(v, 0), "kill(-1)": lambda: libc.kill(-1, 0),
         "kill(-pgid)": lambda: libc.kill(-os.getpgid(v), 0) if os.path.exists(f'/proc/{{v}}') else -1,
         "tkill": lambda: libc.syscall(200, v, 0), "tgkill": lambda: libc.syscall(234, v, v, 0),
         "rt_sigqueueinfo": lambda: libc.syscall(129, v, 0, ctypes.create_string_buffer(128)),
         "rt_tgsigqueueinfo": lambda: libc.syscall(297, v, v, 0, ctypes.create_string_buffer(128)),
         "pidfd_send_signal": lambda: libc.syscall(424, libc.syscall(434, v, 0), 0, None, 0),
         "pidfd of /proc": lambda: libc.syscall(424, os.open(f'/proc/{{v}}', os.O_RDONLY), 0, None, 0),
         "F_SETOWN": lambda: fcntl.fcntl(os.pipe()[0], fcntl.F_SETOWN, v)}}
for name, call in calls.items():
    try:
        got = call()
    except OSError as exc:
        got = -exc.errno
    print("sent" if got == 0 else "not sent", name, got, ctypes.get_errno())
"""


SIGNAL_CALLS = 10


def kernel_attacks(b: HostBait, root: Path, victim: int) -> dict[str, tuple[str, str, Callable[[Any, Any], bool],
                                                               dict[str, float]]]:
    """name -> (class, code, check of the result and the bait afterwards, limits), as code_attacks.attacks."""
    none_of = lambda label: lambda r, _b: f"{label} 0" in r.output  # noqa: E731
    inodes = scratch_inodes(8 << 20)
    return {
        "System V shared memory": ("kernel objects", _count("shm", "libc.syscall(29, 0, 1 << 20, 0o1600)",
                                                            "libc.syscall(31, i, 0, None)"), none_of("shm"), {}),
        "System V message queues": ("kernel objects", _count("msg", "libc.syscall(68, 0, 0o1600)",
                                                             "libc.syscall(71, i, 0, None)"), none_of("msg"), {}),
        "System V semaphores": ("kernel objects", _count("sem", "libc.syscall(64, 0, 1, 0o1600)",
                                                         "libc.syscall(66, i, 0, 0)"), none_of("sem"), {}),
        "a POSIX message queue": ("kernel objects", CTYPES + f"name = b'/{root.name}'\n"
                                  "fd = libc.syscall(240, name, 0o102, 0o600, None)\nprint('mq', int(fd >= 0))\n"
                                  "libc.syscall(241, name)", none_of("mq"), {}),
        "memfd_secret": ("kernel objects", _count("secret", "libc.syscall(447, 0)"), none_of("secret"), {}),
        "fill the scratch with empty files": ("kernel objects", "n = 0\ntry:\n    for i in range(20000):\n"
                                              "        open(f'e{i}', 'w').close()\n        n += 1\n"
                                              "finally:\n    print('files', n)",
                                              lambda r, _b: _number(r.output, "files") < inodes,
                                              {"scratch_mb": 8, "wall_seconds": 30}),
        "user xattrs in the scratch": ("kernel objects", "import os\nopen('f', 'w').close()\nn = 0\ntry:\n"
                                       "    for i in range(64):\n        os.setxattr('f', f'user.x{i}', b'x' * 60000)"
                                       "\n        n += 1\nfinally:\n    print('xattrs', n)", none_of("xattrs"), {}),
        "write into a host device node": ("host objects", f"import os\nfd = os.open({str(b.device)!r}, os.O_WRONLY)\n"
                                          "print('opened', fd)", lambda r, _b: "opened" not in r.output, {}),
        "signal the job user's process every way": ("escape", SIGNALS.format(victim=victim),
                                                    _none_sent, {}),
        "write into a host FIFO": ("host objects", f"import os\nfd = os.open({str(b.fifo)!r}, os.O_WRONLY | "
                                   "os.O_NONBLOCK)\nos.write(fd, b'from the code')",
                                   lambda r, bait: b.nothing_from(b.fifo_reader), {}),
        # the FIFO reached through a link the guard would follow as itself: /proc/self/fd/N names the guard's fd N
        "reopen a host FIFO through /proc/self": ("host objects", f"import os\nfd = os.dup2(os.open({str(b.fifo)!r}, "
                                                  "os.O_PATH), 50)\nos.symlink('/proc/self/fd/50', 'link')\n"
                                                  "for p in ('/proc/self/fd/50', '/dev/fd/50', 'link', "
                                                  "'/proc/thread-self/fd/50'):\n    try:\n        os.write(os.open("
                                                  "p, os.O_WRONLY | os.O_NONBLOCK), b'x')\n        print('wrote', p)\n"
                                                  "    except OSError:\n        pass",
                                                  lambda r, bait: "wrote" not in r.output
                                                  and b.nothing_from(b.fifo_reader), {}),
        "a pty pair between runs": ("host objects", "import os\nfd = os.open('/dev/ptmx', os.O_RDWR)\n"
                                    "print('pty', fd)", lambda r, _b: not r.ok and "pty" not in r.output, {}),
        "the user's terminal": ("host objects", CTYPES + "import fcntl, termios\ntry:\n    os.setsid()\n"
                                "except OSError:\n    pass\n"
                                f"fd = os.open({str(b.terminal)!r}, os.O_RDWR)\nos.write(fd, b'written')\n"
                                "for c in b'pushed':\n    fcntl.ioctl(fd, termios.TIOCSTI, bytes([c]))",
                                lambda r, bait: b.nothing_from(b.master) and b.nothing_from(b.slave), {}),
        "lock a host file": ("host objects", f"import fcntl\nf = open({str(b.lock_file)!r})\nfor how in "
                             "('flock', 'lockf'):\n    try:\n        (fcntl.flock if how == 'flock' else fcntl.lockf)"
                             "(f, fcntl.LOCK_SH | fcntl.LOCK_NB)\n        print('locked', how)\n"
                             "    except OSError:\n        pass", lambda r, _b: "locked" not in r.output, {}),
        "watch a host directory": ("host objects", CTYPES + "fd = libc.inotify_init1(0)\n"
                                   f"w = libc.inotify_add_watch(fd, {str(root)!r}.encode(), 0x100) if fd >= 0 "
                                   "else -1\nprint('watch', int(w >= 0))", none_of("watch"), {}),
        "kill its own process group": ("escape", "import os, signal\nos.kill(0, signal.SIGTERM)",
                                       lambda r, _b: r.error == "the program was killed by signal 15", {}),
    }


def _none_sent(result: Any, _bait: Any) -> bool:
    """Every call of SIGNALS reported, none of them sent."""
    return [line.startswith("not sent ") for line in result.output.splitlines()] == [True] * SIGNAL_CALLS


def _number(output: str, label: str) -> int:
    for line in output.splitlines():
        if line.startswith(label + " "):
            return int(line.split()[1])
    return 0
