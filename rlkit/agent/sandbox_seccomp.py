"""The code tool's seccomp filter (stdlib only): the guard of rlkit/agent/sandbox_child.py installs it before it
forks the runner, and the runner and the code inherit it. The guard runs as `python -I -c` (as `nobody` under root)
and cannot import rlkit: it executes this file's text, which the parent sends in the spec
(rlkit.agent.sandbox.GUARD_SOURCES). Installed after PR_SET_NO_NEW_PRIVS, so without root and without namespaces.

Why each family is denied (EPERM), with or without namespaces:
- every socket (none is needed to compute; a socket is how code reaches the network or a local service);
- io_uring (its operations bypass seccomp); the calls of escapes and of reading other processes;
- memory and kernel objects no limit of the run counts: memfd_create and memfd_secret (memory once written, not
  mapped, or never mapped at all), System V shared memory, semaphores and message queues, POSIX message queues,
  POSIX timers (kernel memory per timer, no rlimit), user xattrs (kernel memory on the scratch tmpfs);
- channels to host objects and between runs: inotify and fanotify (other jobs' files appearing), flock and the
  fcntl locks, leases and dnotify (a lock held on the user's files), TIOCSTI and TIOCLINUX (input pushed into a
  terminal), F_SETPIPE_SZ (pipe buffers beyond the default 64 KiB, kernel memory again);
- any syscall newer than this table (numbers past NEWEST_KNOWN answer ENOSYS, as an older kernel would), so a
  kernel upgrade cannot add an allowed call nobody read.
x86_64 and aarch64 (arch, then numbers; 424 and up are one table on every architecture). x86_64's x32 ABI is
denied whole; a call of another architecture's ABI kills the process.
"""

from __future__ import annotations

import ctypes
import os

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SECCOMP_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
DENIED_SYSCALLS = {
    "x86_64": {"socket": 41, "socketpair": 53, "ptrace": 101, "pivot_root": 155, "chroot": 161, "mount": 165,
               "umount2": 166, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
               "perf_event_open": 298, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311,
               "memfd_create": 319, "bpf": 321, "userfaultfd": 323,
               "shmget": 29, "shmat": 30, "shmctl": 31, "semget": 64, "semop": 65, "semctl": 66, "shmdt": 67,
               "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "semtimedop": 220, "mq_open": 240,
               "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244,
               "mq_getsetattr": 245, "timer_create": 222, "flock": 73, "setxattr": 188, "lsetxattr": 189,
               "fsetxattr": 190, "inotify_init": 253, "inotify_add_watch": 254, "inotify_init1": 294,
               "fanotify_init": 300, "fanotify_mark": 301, "name_to_handle_at": 303, "open_by_handle_at": 304,
               "kcmp": 312},
    "aarch64": {"umount2": 39, "mount": 40, "pivot_root": 41, "chroot": 51, "unshare": 97, "ptrace": 117,
                "socket": 198, "socketpair": 199, "add_key": 217, "request_key": 218, "keyctl": 219,
                "perf_event_open": 241, "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271,
                "memfd_create": 279, "bpf": 280, "userfaultfd": 282,
                "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "inotify_init1": 26, "inotify_add_watch": 27,
                "flock": 32, "timer_create": 107, "mq_open": 180, "mq_unlink": 181, "mq_timedsend": 182,
                "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185, "msgget": 186, "msgctl": 187,
                "msgrcv": 188, "msgsnd": 189, "semget": 190, "semctl": 191, "semtimedop": 192, "semop": 193,
                "shmget": 194, "shmctl": 195, "shmat": 196, "shmdt": 197, "fanotify_init": 262,
                "fanotify_mark": 263, "name_to_handle_at": 264, "open_by_handle_at": 265, "kcmp": 272},
}
DENIED_EVERYWHERE = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
                     "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
                     "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442, "quotactl_fd": 443,
                     "memfd_secret": 447, "setxattrat": 463, "open_tree_attr": 467}
NEWEST_KNOWN = 469  # file_setattr (Linux 6.17): every number above answers ENOSYS
# (syscall, argument index, denied values of its low 32 bits): fcntl's and ioctl's commands
FCNTL = {"x86_64": 72, "aarch64": 25}
IOCTL = {"x86_64": 16, "aarch64": 29}
F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_NOTIFY, F_SETPIPE_SZ = 6, 7, 37, 38, 1024, 1026, 1031
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
DENIED_COMMANDS = {"fcntl": (F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_NOTIFY, F_SETPIPE_SZ),
                   "ioctl": (TIOCSTI, TIOCLINUX)}
X32_BIT = 0x40000000  # x86_64's x32 ABI numbers: denied whole
LD_ABS, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
ALLOW, DENY, NOSYS, KILL = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38, 0x80000000  # ERRNO|EPERM, ERRNO|ENOSYS


def install_filter(libc: ctypes.CDLL, program: list[tuple[int, int, int, int]]) -> str:
    """Install a classic-BPF seccomp program of (code, jt, jf, k) instructions; '' when installed, else why not."""

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(program))(*[SockFilter(*instruction) for instruction in program])
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(SockFprog(len(program), filters)), 0, 0) != 0:
        return os.strerror(ctypes.get_errno())
    return ""


def filter_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The classic-BPF program: arch check, then the denied numbers, then the denied commands of fcntl and ioctl.
    Jumps are relative and forward only; every branch ends at one of the four returns at the end."""
    numbers = sorted(set(DENIED_SYSCALLS[machine].values()) | set(DENIED_EVERYWHERE.values()))
    commands = [(FCNTL[machine], DENIED_COMMANDS["fcntl"]), (IOCTL[machine], DENIED_COMMANDS["ioctl"])]
    # symbolic: (code, jump-if-true label, jump-if-false label, k); labels: None (next), "allow", "deny", ...
    arch = SECCOMP_ARCH[machine]
    body: list[tuple[int, str | None, str | None, int]] = [
        (LD_ABS, None, None, 4), (JEQ, None, "kill", arch), (LD_ABS, None, None, 0)]
    if machine == "x86_64":
        body.append((JGE, "deny", None, X32_BIT))
    body.append((JGE, "nosys", None, NEWEST_KNOWN + 1))
    body += [(JEQ, "deny", None, number) for number in numbers]
    for index, (number, values) in enumerate(commands):
        skip = f"after{index}"
        body.append((JEQ, None, skip, number))
        body.append((LD_ABS, None, None, 16 + 8 * 1))  # args[1], its low 32 bits (little-endian on both)
        body += [(JEQ, "deny", None, value) for value in values]
        body.append((JEQ, "allow", "allow", 0))  # the call's other commands: allowed
        body.append((-1, skip, None, 0))  # the label `skip` (no instruction)
    body += [(RET, "allow", None, ALLOW), (RET, "deny", None, DENY), (RET, "nosys", None, NOSYS),
             (RET, "kill", None, KILL)]
    return _resolve(body)


def _resolve(body: list[tuple[int, str | None, str | None, int]]) -> list[tuple[int, int, int, int]]:
    """Symbolic jumps to BPF offsets: a RET's first label and a (-1, label) marker name the next position."""
    where: dict[str, int] = {}
    program: list[tuple[int, str | None, str | None, int]] = []
    for code, first, second, k in body:
        if code == -1:
            where[str(first)] = len(program)
        elif code == RET:
            where[str(first)] = len(program)
            program.append((code, None, None, k))
        else:
            program.append((code, first, second, k))

    def offset(position: int, label: str | None) -> int:
        if label is None:
            return 0
        jump = where[label] - position - 1
        if not 0 <= jump <= 255:
            raise ValueError(f"seccomp jump to {label} out of range: {jump}")
        return jump

    return [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(program)]


def deny_syscalls(libc: ctypes.CDLL) -> str:
    """Install the filter of filter_program; '' when installed, else why not. Unprivileged (after
    PR_SET_NO_NEW_PRIVS) and without namespaces."""
    machine = os.uname().machine
    if machine not in SECCOMP_ARCH:
        return f"no syscall table for {machine}"
    return install_filter(libc, filter_program(machine))
