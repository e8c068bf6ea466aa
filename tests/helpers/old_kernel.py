"""Run a command as on a kernel before 5.12, which has no mount_setattr(2): a seccomp filter makes that one call fail
with ENOSYS (what such a kernel answers) for the command and everything it starts. Needs no privileges (it sets
PR_SET_NO_NEW_PRIVS first, which also keeps setuid programs from gaining any)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

LAUNCHER = r"""
import ctypes, os, sys
from rlkit.agent.sandbox_seccomp import install_filter
libc = ctypes.CDLL(None, use_errno=True)
ENOSYS, SYS_MOUNT_SETATTR = 38, 442  # the same number on every architecture
program = [(0x20, 0, 0, 0), (0x15, 0, 1, SYS_MOUNT_SETATTR), (0x06, 0, 0, 0x00050000 | ENOSYS),
           (0x06, 0, 0, 0x7FFF0000)]  # ld nr; jeq 442 ? errno(ENOSYS) : allow
if libc.prctl(38, 1, 0, 0, 0) != 0 or install_filter(libc, program):
    os.write(2, b"the seccomp filter could not be installed\n"); os._exit(92)
os.execv(sys.argv[1], sys.argv[1:])
"""


def run_without_mount_setattr(argv: Sequence[str], *, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """`argv` (its first item an absolute path) on a kernel without mount_setattr, as the calling user."""
    return subprocess.run([sys.executable, "-c", LAUNCHER, *argv], capture_output=True, text=True, timeout=timeout,
                          check=False)
