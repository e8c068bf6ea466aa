"""Run a command as a node without unprivileged user namespaces would: in a user namespace of its own (uids and
gids 0-65535 mapped to the same ids outside, so root stays root and `nobody` stays `nobody`) whose
`user.max_user_namespaces` is 0, so no further user namespace can be created in it. The host's own setting is not
touched. Needs root outside (to map more than one id); run a non-root case with `as_user`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

LAUNCHER = r"""
import ctypes, os, sys
CLONE_NEWUSER = 0x10000000
libc = ctypes.CDLL(None, use_errno=True)
to_child_r, to_child_w = os.pipe()
to_parent_r, to_parent_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(to_child_w); os.close(to_parent_r)
    if libc.unshare(CLONE_NEWUSER) != 0:
        os.write(2, b"unshare(CLONE_NEWUSER) failed\n"); os._exit(90)
    os.write(to_parent_w, b"u"); os.close(to_parent_w)
    if os.read(to_child_r, 1) != b"m":
        os._exit(91)
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")
    uid = int(sys.argv[1])
    if uid >= 0:
        os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
    os.execv(sys.argv[2], sys.argv[2:])
os.close(to_child_r); os.close(to_parent_w)
if os.read(to_parent_r, 1) == b"u":
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write("0 0 65536\n")
    os.write(to_child_w, b"m")
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_without_user_namespaces(argv: Sequence[str], *, as_user: int | None = None, timeout: float = 120.0,
                                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`argv` (its first item an absolute path) where user namespaces cannot be created, as root or `as_user`."""
    return subprocess.run([sys.executable, "-c", LAUNCHER, str(-1 if as_user is None else as_user), *argv],
                          capture_output=True, text=True, timeout=timeout, env=env, check=False)
