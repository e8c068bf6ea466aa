"""56 model-code attacks on the code tool (tests/helpers/code_attacks.py: secrets, writes and persistence, network
and local IPC, resources, escape, cross-run leakage, output forgery; code_attacks_kernel.py: kernel objects no limit
counts, host objects shared between runs, signals to the job user's processes), run the ways HPC jobs meet them:
as root (the code runs as `nobody`), as a non-root user (`setpriv`, the code runs as that user), on a node
without user namespaces (a user namespace of its own whose user.max_user_namespaces is 0:
tests/helpers/no_userns.py), on a kernel before 5.12 and on a node that refuses mount() (tests/helpers/old_kernel.py),
as root and as a non-root user. Each way runs the attacks in one
process of its own with /usr/bin/python3, as a node would.

With isolation required (the default) every attack is denied or a tool error and leaves nothing behind where the
node can isolate, and where it cannot, no attack's code ever starts. With best_effort on such a node, exactly the
attacks the table of docs/guides/code-tool.md lists get through."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers.no_userns import run_without_user_namespaces
from tests.helpers.old_kernel import run_with_mount_refused, run_without_mount_setattr

PROBE = [str(Path("/usr/bin/python3")), str(REPO / "tests" / "helpers" / "code_attacks.py")]
NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mapping users and setpriv need root (CI runs as root)")


@pytest.fixture(autouse=True, scope="module")
def host_device() -> Iterator[Path]:
    """A 0666 character device outside /dev (urandom's numbers) for the attack "write into a host device node",
    made here because a probe without CAP_MKNOD (non-root, or root in a user namespace) cannot make one; named to
    every probe through RLKIT_ATTACK_DEVICE."""
    directory = Path(tempfile.mkdtemp(prefix="rlkit-attack-device-"))
    directory.chmod(0o755)
    device = directory / "urandom"
    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 9))
    device.chmod(0o666)
    os.environ["RLKIT_ATTACK_DEVICE"] = str(device)
    try:
        yield device
    finally:
        del os.environ["RLKIT_ATTACK_DEVICE"]
        shutil.rmtree(directory, ignore_errors=True)


def _landlock() -> bool:
    """Whether this kernel enforces Landlock (landlock_create_ruleset's ABI version query)."""
    import ctypes

    return int(ctypes.CDLL(None, use_errno=True).syscall(444, None, 0, 1)) >= 1


# best_effort on a node without user namespaces: what gets through (docs/guides/code-tool.md, its table)
# (no socket through ctypes: the seccomp filter denies creating any socket, with or without namespaces)
THROUGH_WITHOUT_NAMESPACES = {"read a hidden file", "list a hidden directory", "read a hidden single file",
                              "read a concurrent run's scratch", "fill the scratch directory",
                              "fill the scratch with empty files"}
# ... and on a kernel without Landlock (before 5.13, or not enabled), every write the job's user could make but
# into FIFOs and device nodes (the guard checks each open for writing: rlkit/agent/sandbox_opens.py)
WRITES_WITHOUT_LANDLOCK = {"write outside the scratch directory", "append to the user's reward module",
                           "write through ctypes open", "leave a file in /dev/shm"}
# ... and for a non-root job, without Landlock (which scopes /proc access to the run), the environments of the
# job user's processes; no signal reaches them (the seccomp filter lets the code signal itself only)
NON_ROOT_WITHOUT_LANDLOCK = {"scan every process environment"}


def _report(completed: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    assert completed.returncode == 0, completed.stderr[-2000:]
    report: dict[str, dict[str, object]] = json.loads(completed.stdout.strip().splitlines()[-1])
    assert len(report) >= 30, sorted(report)
    return report


def _run(isolation: str, *, user: int | None, namespaces: bool, old_kernel: bool = False,
         mount_refused: bool = False) -> dict[str, dict[str, object]]:
    argv = [*PROBE, isolation]
    if not namespaces:
        return _report(run_without_user_namespaces(argv, as_user=user, timeout=300))
    if user is not None:
        argv = ["/usr/bin/setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    if old_kernel:
        return _report(run_without_mount_setattr(argv, timeout=300))
    if mount_refused:
        return _report(run_with_mount_refused(argv, timeout=300))
    return _report(subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False))


@pytest.mark.parametrize("user", [None, NOBODY], ids=["root", "non-root"])
def test_every_attack_is_denied_where_the_node_can_isolate(user: int | None) -> None:
    report = _run("required", user=user, namespaces=True)
    assert not [name for name, r in report.items() if r["refused"]], "a node with namespaces refused a run"
    assert [name for name, r in report.items() if not r["held"]] == [], report
    assert not [name for name, r in report.items() if r["notes"]], "isolation notes on a node that isolates"


@pytest.mark.parametrize("user", [None, NOBODY], ids=["root", "non-root"])
def test_a_kernel_without_mount_setattr_remounts_each_mount_and_still_holds(user: int | None) -> None:
    """Linux before 5.12 has no mount_setattr(2) nor Landlock (here: a seccomp filter answers ENOSYS): the guard
    remounts every mount read-only and nodev one by one instead, checks each open for writing (host FIFOs and
    device nodes refused), and every attack is held as on a newer kernel, nothing refused, nothing noted."""
    report = _run("required", user=user, namespaces=True, old_kernel=True)
    assert not [name for name, r in report.items() if r["refused"]], report
    assert [name for name, r in report.items() if not r["held"]] == [], report
    assert not [name for name, r in report.items() if r["notes"]], report


@pytest.mark.parametrize("user", [None, NOBODY], ids=["root", "non-root"])
def test_where_mount_is_refused_no_attack_code_ever_starts(user: int | None) -> None:
    """User namespaces work but mount() is refused (a container's seccomp profile): the private /proc and the
    file-system view cannot be made, so every run is refused with the reason and the bait stays untouched."""
    report = _run("required", user=user, namespaces=True, mount_refused=True)
    assert [name for name, r in report.items() if not (r["refused"] and r["held"])] == [], report
    assert all("private /proc not mounted: Operation not permitted" in r["notes"] for r in report.values()), report


@pytest.mark.parametrize("user", [None, NOBODY], ids=["root", "non-root"])
def test_without_user_namespaces_no_attack_code_ever_starts(user: int | None) -> None:
    """Fail closed: every run refused with the reason, and the bait untouched (files, listeners, the victim)."""
    report = _run("required", user=user, namespaces=False)
    assert [name for name, r in report.items() if not (r["refused"] and r["held"])] == [], report
    assert all("no namespaces (they could not be created)" in str(r["why"]) for r in report.values())


@pytest.mark.parametrize("user", [None, NOBODY], ids=["root", "non-root"])
def test_best_effort_without_user_namespaces_lets_through_exactly_what_the_readme_says(user: int | None) -> None:
    """Root and non-root alike: what the job's user may read, its scratch beside concurrent runs'; never a signal
    to the job user's processes (the non-root job's own: seccomp, and Landlock's signal scope from ABI 6)."""
    report = _run("best_effort", user=user, namespaces=False)
    through = THROUGH_WITHOUT_NAMESPACES
    if not _landlock():
        through = through | WRITES_WITHOUT_LANDLOCK | (NON_ROOT_WITHOUT_LANDLOCK if user is not None else set())
    assert {name for name, r in report.items() if not r["held"]} == through
    assert all(r["notes"] for r in report.values()), "every best-effort run must say what did not hold"
