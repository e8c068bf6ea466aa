"""Run a command as on an older kernel or a node that refuses mounts: a seccomp filter makes chosen calls fail with
the errno such a node answers, for the command and everything it starts. Needs no privileges (it sets
PR_SET_NO_NEW_PRIVS first, which also keeps setuid programs from gaining any).

- before Linux 5.12 (run_without_mount_setattr): no mount_setattr(2) and no Landlock (5.13): ENOSYS;
- mount() refused (run_with_mount_refused), as under a container runtime's or a site's seccomp profile: mount(2)
  and mount_setattr(2) answer EPERM while user namespaces can still be made;
- before Linux 5.0 (run_without_user_notification, RHEL 8's 4.18): as before 5.12, and seccomp(2) answers EINVAL
  (no SECCOMP_FILTER_FLAG_NEW_LISTENER), so the guard cannot check the code's opens for writing."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

ENOSYS, EPERM, EINVAL = 38, 1, 22
SYS_MOUNT = {"x86_64": 165, "aarch64": 40}
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
OLD_KERNEL = [(442, ENOSYS), (444, ENOSYS), (445, ENOSYS), (446, ENOSYS)]  # mount_setattr, Landlock
LAUNCHER = r"""
import ctypes, json, os, sys
from rlkit.agent.sandbox_seccomp import install_filter
libc = ctypes.CDLL(None, use_errno=True)
program = [(0x20, 0, 0, 0)]  # ld nr; then per call: jeq nr ? errno : next; allow
for number, errno in json.loads(sys.argv[1]):
    program += [(0x15, 0, 1, number), (0x06, 0, 0, 0x00050000 | errno)]
program.append((0x06, 0, 0, 0x7FFF0000))
if libc.prctl(38, 1, 0, 0, 0) != 0 or install_filter(libc, program):
    os.write(2, b"the seccomp filter could not be installed\n"); os._exit(92)
os.execv(sys.argv[2], sys.argv[2:])
"""


def _run_failing(calls: list[tuple[int, int]], argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    import json

    return subprocess.run([sys.executable, "-c", LAUNCHER, json.dumps(calls), *argv], capture_output=True, text=True,
                          timeout=timeout, check=False)


def run_without_mount_setattr(argv: Sequence[str], *, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """`argv` (its first item an absolute path) on a kernel without mount_setattr nor Landlock, as the caller."""
    return _run_failing(OLD_KERNEL, argv, timeout)


def run_without_user_notification(argv: Sequence[str], *, timeout: float = 120.0,
                                  ) -> subprocess.CompletedProcess[str]:
    """`argv` as on a kernel before 5.0: no mount_setattr, no Landlock, no seccomp listener, as the caller."""
    import os

    return _run_failing([*OLD_KERNEL, (SYS_SECCOMP[os.uname().machine], EINVAL)], argv, timeout)


def run_with_mount_refused(argv: Sequence[str], *, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """`argv` where mount(2) and mount_setattr(2) are refused (EPERM), as the calling user."""
    import os

    return _run_failing([(SYS_MOUNT[os.uname().machine], EPERM), (442, EPERM)], argv, timeout)
