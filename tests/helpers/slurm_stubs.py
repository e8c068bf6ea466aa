"""Slurm's client commands as executables for tests that run the job script (rlkit/launch/supervisor.sh): it runs
each call under coreutils `timeout`, which runs programs, never a bash function of the same name, so stubs must be
files first on PATH; every one of squeue, scancel and scontrol gets one, so the machine's own Slurm is never reached."""

from __future__ import annotations

import os
from pathlib import Path


def slurm_bin(tmp_path: Path, **bodies: str) -> Path:
    """A directory of stubs (`squeue="..."`: the bash body of `squeue`; a command not given does nothing) to put
    first on PATH (`path_with`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("squeue", "scancel", "scontrol"):
        stub = bin_dir / name
        stub.write_text(f"#!/bin/bash\n{bodies.get(name, ':')}\n")
        stub.chmod(0o755)
    return bin_dir


def path_with(bin_dir: Path) -> str:
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
