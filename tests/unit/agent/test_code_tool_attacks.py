"""40 model-code attacks on the code tool (tests/helpers/code_attacks.py: secrets, writes and persistence, network
and local IPC, resources, escape, cross-run leakage, output forgery), run three ways as HPC jobs meet them: as root
(the code runs as `nobody`), as a non-root user (`setpriv`, the code runs as that user), and on a node without user
namespaces (a user namespace of its own whose user.max_user_namespaces is 0: tests/helpers/no_userns.py), as root
and as a non-root user. Each way runs the attacks in one process of its own with /usr/bin/python3, as a node would.

With isolation required (the default) every attack is denied or a tool error and leaves nothing behind where the
node can isolate, and where it cannot, no attack's code ever starts. With best_effort on such a node, exactly the
attacks the table of docs/guides/code-tool.md lists get through."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers.no_userns import run_without_user_namespaces
from tests.helpers.old_kernel import run_without_mount_setattr

PROBE = [str(Path("/usr/bin/python3")), str(REPO / "tests" / "helpers" / "code_attacks.py")]
NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mapping users and setpriv need root (CI runs as root)")

# best_effort on a node without user namespaces: what gets through (docs/guides/code-tool.md, its table)
# (no socket through ctypes: the seccomp filter denies creating any socket, with or without namespaces)
THROUGH_WITHOUT_NAMESPACES = {"read a hidden file", "list a hidden directory", "read a hidden single file",
                              "write outside the scratch directory", "append to the user's reward module",
                              "write through ctypes open", "leave a file in /dev/shm",
                              "read a concurrent run's scratch", "fill the scratch directory"}
# ... and for a non-root job also what the job's own user can do to its own processes
THROUGH_WITHOUT_NAMESPACES_NON_ROOT = THROUGH_WITHOUT_NAMESPACES | {"scan every process environment",
                                                                    "kill a process of the job's user"}


def _report(completed: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    assert completed.returncode == 0, completed.stderr[-2000:]
    report: dict[str, dict[str, object]] = json.loads(completed.stdout.strip().splitlines()[-1])
    assert len(report) >= 30, sorted(report)
    return report


def _run(isolation: str, *, user: int | None, namespaces: bool, old_kernel: bool = False
         ) -> dict[str, dict[str, object]]:
    argv = [*PROBE, isolation]
    if not namespaces:
        return _report(run_without_user_namespaces(argv, as_user=user, timeout=300))
    if user is not None:
        argv = ["/usr/bin/setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    if old_kernel:
        return _report(run_without_mount_setattr(argv, timeout=300))
    return _report(subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False))


@pytest.mark.parametrize("user", [None, NOBODY], ids=["root", "non-root"])
def test_every_attack_is_denied_where_the_node_can_isolate(user: int | None) -> None:
    report = _run("required", user=user, namespaces=True)
    assert not [name for name, r in report.items() if r["refused"]], "a node with namespaces refused a run"
    assert [name for name, r in report.items() if not r["held"]] == [], report
    assert not [name for name, r in report.items() if r["notes"]], "isolation notes on a node that isolates"


@pytest.mark.parametrize("user", [None, NOBODY], ids=["root", "non-root"])
def test_a_kernel_without_mount_setattr_remounts_each_mount_and_still_holds(user: int | None) -> None:
    """Linux before 5.12 has no mount_setattr(2) (here: a seccomp filter answers ENOSYS): the guard remounts every
    mount read-only one by one instead, and every attack is held as on a newer kernel, nothing refused."""
    report = _run("required", user=user, namespaces=True, old_kernel=True)
    assert not [name for name, r in report.items() if r["refused"]], report
    assert [name for name, r in report.items() if not r["held"]] == [], report
    assert not [name for name, r in report.items() if r["notes"]], report


@pytest.mark.parametrize("user", [None, NOBODY], ids=["root", "non-root"])
def test_without_user_namespaces_no_attack_code_ever_starts(user: int | None) -> None:
    """Fail closed: every run refused with the reason, and the bait untouched (files, listeners, the victim)."""
    report = _run("required", user=user, namespaces=False)
    assert [name for name, r in report.items() if not (r["refused"] and r["held"])] == [], report
    assert all("no namespaces (they could not be created)" in str(r["why"]) for r in report.values())


@pytest.mark.parametrize(("user", "through"), [(None, THROUGH_WITHOUT_NAMESPACES),
                                               (NOBODY, THROUGH_WITHOUT_NAMESPACES_NON_ROOT)],
                         ids=["root", "non-root"])
def test_best_effort_without_user_namespaces_lets_through_exactly_what_the_readme_says(
        user: int | None, through: set[str]) -> None:
    report = _run("best_effort", user=user, namespaces=False)
    assert {name for name, r in report.items() if not r["held"]} == through
    assert all(r["notes"] for r in report.values()), "every best-effort run must say what did not hold"
