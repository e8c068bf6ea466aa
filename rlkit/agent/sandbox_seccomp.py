"""The code tool's seccomp filter (stdlib only): the guard of rlkit/agent/sandbox_child.py installs it before it
forks the runner, and the runner and the code inherit it. The guard runs as `python -I -c` (as `nobody` under root)
and cannot import rlkit: it executes this file's text, which the parent sends in the spec
(rlkit.agent.sandbox.SECCOMP_SOURCE). Installed after PR_SET_NO_NEW_PRIVS, so without root and without namespaces.
"""

from __future__ import annotations

import ctypes
import os

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
# Denied to the code by a seccomp filter (EPERM), with or without namespaces: every socket (none is needed to
# compute; a socket is how code reaches the network, a unix socket bound after the run began, or an abstract one),
# io_uring (whose operations bypass seccomp), memfd_create (memory no limit counts once it is written, not mapped),
# and the calls of escapes and of reading other processes. x86_64 and
# aarch64 (arch, then numbers; the new mount API 428-433, 442 is one table on every architecture).
SECCOMP_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
DENIED_SYSCALLS = {
    "x86_64": {"socket": 41, "socketpair": 53, "ptrace": 101, "pivot_root": 155, "chroot": 161, "mount": 165,
               "umount2": 166, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
               "perf_event_open": 298, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311,
               "memfd_create": 319, "bpf": 321, "userfaultfd": 323},
    "aarch64": {"umount2": 39, "mount": 40, "pivot_root": 41, "chroot": 51, "unshare": 97, "ptrace": 117,
                "socket": 198, "socketpair": 199, "add_key": 217, "request_key": 218, "keyctl": 219,
                "perf_event_open": 241, "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271,
                "memfd_create": 279, "bpf": 280, "userfaultfd": 282},
}
DENIED_EVERYWHERE = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
                     "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
                     "mount_setattr": 442}
X32_BIT = 0x40000000  # x86_64's x32 ABI numbers: denied whole


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


def deny_syscalls(libc: ctypes.CDLL) -> str:
    """Install the seccomp filter of DENIED_SYSCALLS (EPERM; a call from another architecture's ABI kills the
    process); '' when installed, else why not. Unprivileged (after PR_SET_NO_NEW_PRIVS) and without namespaces."""
    machine = os.uname().machine
    if machine not in SECCOMP_ARCH:
        return f"no syscall table for {machine}"
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny, kill = 0x7FFF0000, 0x00050000 | 1, 0x80000000  # RET_ALLOW, RET_ERRNO | EPERM, RET_KILL_PROCESS
    numbers = sorted(set(DENIED_SYSCALLS[machine].values()) | set(DENIED_EVERYWHERE.values()))
    checks = [(jge, X32_BIT)] if machine == "x86_64" else []
    checks += [(jeq, number) for number in numbers]
    program = [(ld_abs, 0, 0, 4), (jeq, 0, len(checks) + 3, SECCOMP_ARCH[machine]), (ld_abs, 0, 0, 0)]
    for index, (op, value) in enumerate(checks):  # a match jumps to `deny`, right after the `allow` below
        program.append((op, len(checks) - index, 0, value))
    program += [(ret, 0, 0, allow), (ret, 0, 0, deny), (ret, 0, 0, kill)]

    return install_filter(libc, program)
