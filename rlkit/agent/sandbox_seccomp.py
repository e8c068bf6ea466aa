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
  terminal), F_SETPIPE_SZ (pipe buffers beyond the default 64 KiB, kernel memory again), F_SETOWN(_EX) and
  F_SETSIG (a SIGIO, or any signal, sent to another process of the user when a pipe becomes readable);
- signals to any process but the code's own (limit_signals, which the runner adds once it knows its pid): without
  a pid namespace the job user's other processes are the same user's, which kill(2) lets through;
- without Landlock, opens for writing go to the guard (seccomp user notification, Linux >= 5.5), which refuses
  host FIFOs and device nodes (rlkit/agent/sandbox_opens.py); openat2, whose flags it cannot read, answers ENOSYS;
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
F_SETOWN, F_SETSIG, F_SETOWN_EX = 8, 10, 15
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
DENIED_COMMANDS = {"fcntl": (F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_NOTIFY, F_SETPIPE_SZ,
                             F_SETOWN, F_SETSIG, F_SETOWN_EX),
                   "ioctl": (TIOCSTI, TIOCLINUX)}
# the signal calls: kill (pid), then those whose first argument is the target's pid or thread group id
SYS_KILL = {"x86_64": 62, "aarch64": 129}
SIGNAL_OWN = {"x86_64": (200, 234, 129, 297, 434), "aarch64": (130, 131, 138, 240, 434)}  # tkill, tgkill,
PIDFD_SEND_SIGNAL = 424  # rt_sigqueueinfo, rt_tgsigqueueinfo, pidfd_open; pidfd_send_signal takes any /proc/PID fd
# the opens the guard checks without Landlock: number -> (index of dirfd or None, of the path, of the flags or None)
OPENS: dict[str, dict[int, tuple[int | None, int, int | None]]] = {
    "x86_64": {2: (None, 0, 1), 85: (None, 0, None), 257: (0, 1, 2)}, "aarch64": {56: (0, 1, 2)}}
OPENAT2 = 437
O_ACCMODE_WRITE = 0x3  # O_WRONLY | O_RDWR
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER = 1, 1 << 3
X32_BIT = 0x40000000  # x86_64's x32 ABI numbers: denied whole
LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
ALLOW, DENY, NOSYS, KILL = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38, 0x80000000  # ERRNO|EPERM, ERRNO|ENOSYS
NOTIFY = 0x7FC00000  # SECCOMP_RET_USER_NOTIF: the listener (the guard) answers


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def install_filter(libc: ctypes.CDLL, program: list[tuple[int, int, int, int]]) -> str:
    """Install a classic-BPF seccomp program of (code, jt, jf, k) instructions; '' when installed, else why not."""

    filters = (_SockFilter * len(program))(*[_SockFilter(*instruction) for instruction in program])
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(_SockFprog(len(program), filters)), 0, 0) != 0:
        return os.strerror(ctypes.get_errno())
    return ""


def filter_program(machine: str, *, supervise_opens: bool = False) -> list[tuple[int, int, int, int]]:
    """The classic-BPF program: arch check, then the denied numbers, then the denied commands of fcntl and ioctl,
    then (supervise_opens) the opens for writing, sent to the listener. Jumps are relative and forward only; every
    branch ends at one of the returns at the end."""
    numbers = sorted(set(DENIED_SYSCALLS[machine].values()) | set(DENIED_EVERYWHERE.values()))
    commands = [(FCNTL[machine], 1, "deny", DENIED_COMMANDS["fcntl"]),
                (IOCTL[machine], 1, "deny", DENIED_COMMANDS["ioctl"])]
    # symbolic: (code, jump-if-true label, jump-if-false label, k); labels: None (next), "allow", "deny", ...
    arch = SECCOMP_ARCH[machine]
    body: list[tuple[int, str | None, str | None, int]] = [
        (LD_ABS, None, None, 4), (JEQ, None, "kill", arch), (LD_ABS, None, None, 0)]
    if machine == "x86_64":
        body.append((JGE, "deny", None, X32_BIT))
    body.append((JGE, "nosys", None, NEWEST_KNOWN + 1))
    body += [(JEQ, "deny", None, number) for number in numbers]
    if supervise_opens:
        body.append((JEQ, "nosys", None, OPENAT2))
    for index, (number, argument, verdict, values) in enumerate(commands):
        skip = f"after{index}"
        body.append((JEQ, None, skip, number))
        body.append((LD_ABS, None, None, 16 + 8 * argument))  # its low 32 bits (little-endian on both)
        body += [(JEQ, verdict, None, value) for value in values]
        body.append((JEQ, "allow", "allow", 0))  # the call's other commands: allowed
        body.append((-1, skip, None, 0))  # the label `skip` (no instruction)
    if supervise_opens:
        for number, (_dirfd, _path, flags) in OPENS[machine].items():
            if flags is None:  # creat(2): always for writing
                body.append((JEQ, "notify", None, number))
                continue
            body += [(JEQ, None, f"open{number}", number), (LD_ABS, None, None, 16 + 8 * flags),
                     (JSET, "notify", "allow", O_ACCMODE_WRITE), (-1, f"open{number}", None, 0)]
    body += [(RET, "allow", None, ALLOW), (RET, "deny", None, DENY), (RET, "nosys", None, NOSYS),
             (RET, "kill", None, KILL)]
    if supervise_opens:
        body.append((RET, "notify", None, NOTIFY))
    return _resolve(body)


def signal_program(machine: str, pid: int) -> list[tuple[int, int, int, int]]:
    """kill(2) only to 0 (its own process group), `pid` or -`pid`; tkill, tgkill, rt_(tg)sigqueueinfo and
    pidfd_open only for `pid`; pidfd_send_signal never. Other architectures' calls: left to the first filter."""
    own, group = pid & 0xFFFFFFFF, -pid & 0xFFFFFFFF
    body: list[tuple[int, str | None, str | None, int]] = [
        (LD_ABS, None, None, 4), (JEQ, None, "allow", SECCOMP_ARCH[machine]), (LD_ABS, None, None, 0),
        (JEQ, "kill", None, SYS_KILL[machine]), (JEQ, "deny", None, PIDFD_SEND_SIGNAL)]
    body += [(JEQ, "own", None, number) for number in SIGNAL_OWN[machine]]
    body += [(JEQ, "allow", "allow", 0), (-1, "kill", None, 0), (LD_ABS, None, None, 16),
             (JEQ, "allow", None, 0), (JEQ, "allow", None, group), (JEQ, "allow", "deny", own),
             (-1, "own", None, 0), (LD_ABS, None, None, 16), (JEQ, "allow", "deny", own),
             (RET, "allow", None, ALLOW), (RET, "deny", None, DENY)]
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


def deny_syscalls(libc: ctypes.CDLL, *, supervise_opens: bool = False) -> tuple[str, int | None]:
    """Install the filter of filter_program: ('', None) when installed, with supervise_opens ('', the listener's
    fd), or the plain filter where the kernel gives no listener; (why not, None) when no filter is installed.
    Unprivileged (after PR_SET_NO_NEW_PRIVS) and without namespaces."""
    machine = os.uname().machine
    if machine not in SECCOMP_ARCH:
        return f"no syscall table for {machine}", None
    if supervise_opens:
        listener = install_with_listener(libc, filter_program(machine, supervise_opens=True))
        if isinstance(listener, int):
            return "", listener
        return install_filter(libc, filter_program(machine)), None  # the guard says what is left unchecked
    return install_filter(libc, filter_program(machine)), None


def install_with_listener(libc: ctypes.CDLL, program: list[tuple[int, int, int, int]]) -> int | str:
    """seccomp(2) with SECCOMP_FILTER_FLAG_NEW_LISTENER: the listener's fd (close-on-exec), or why not."""

    filters = (_SockFilter * len(program))(*[_SockFilter(*instruction) for instruction in program])
    fd = int(libc.syscall(ctypes.c_long(SYS_SECCOMP[os.uname().machine]), ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
                          ctypes.c_uint(SECCOMP_FILTER_FLAG_NEW_LISTENER),
                          ctypes.byref(_SockFprog(len(program), filters))))
    return fd if fd >= 0 else os.strerror(ctypes.get_errno())


def limit_signals(libc: ctypes.CDLL, pid: int) -> str:
    """Add signal_program for `pid` (the runner, once it has its own session); '' when installed, else why not."""
    machine = os.uname().machine
    if machine not in SECCOMP_ARCH:
        return f"no syscall table for {machine}"
    return install_filter(libc, signal_program(machine, pid))
