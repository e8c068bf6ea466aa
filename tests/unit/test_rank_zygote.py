"""The rank zygote (tests/helpers/rank_zygote.py) that the gloo-rank tests fork their ranks from: each forked rank
sees only its own environment and arguments, its output and exit code come back as from a fresh `python -c`, and a
rank that outlives its wait is killed by PID."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helpers.rank_zygote import ForkedRank

SCRIPT = r'''
import os, sys
print("argv", sys.argv[1:], "mine", os.environ.get("ONLY_MINE"), "main", __name__ == "__main__", flush=True)
print("to stderr", file=sys.stderr)
os.environ["LEAKED"] = "1"
if sys.argv[1] == "kill":
    os.kill(os.getpid(), 9)
if sys.argv[1] == "sleep":
    import signal
    signal.pause()  # until killed
raise SystemExit(int(sys.argv[1]) if sys.argv[1].isdigit() else 0)
'''


def test_a_forked_rank_has_its_own_arguments_environment_output_and_exit_code() -> None:
    first = ForkedRank(SCRIPT, ["3"], {**os.environ, "ONLY_MINE": "a"})
    second = ForkedRank(SCRIPT, ["x y"], {k: v for k, v in os.environ.items() if k != "ONLY_MINE"})
    out, _ = first.communicate(timeout=60)
    assert "argv ['3'] mine a main True" in out and "to stderr" in out and first.returncode == 3
    out, _ = second.communicate(timeout=60)
    assert "argv ['x y'] mine None main True" in out and second.returncode == 0
    third = ForkedRank("import os; print(os.environ.get('LEAKED'))", [], dict(os.environ))
    assert third.communicate(timeout=60)[0].strip() == "None"  # nothing of an earlier rank's stays behind
    assert third.pid not in (first.pid, second.pid)


def test_a_killed_rank_reports_the_signal_and_a_late_one_is_killed_by_pid() -> None:
    killed = ForkedRank(SCRIPT, ["kill"], dict(os.environ))
    assert "argv ['kill']" in killed.communicate(timeout=60)[0] and killed.returncode == -9
    sleeping = ForkedRank(SCRIPT, ["sleep"], dict(os.environ))
    with pytest.raises(subprocess.TimeoutExpired):
        sleeping.communicate(timeout=2)
    assert sleeping.poll() is None
    sleeping.kill()
    out, _ = sleeping.communicate(timeout=60)
    assert "argv ['sleep']" in out and sleeping.returncode == -9
