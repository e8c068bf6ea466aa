"""The job's interpreter on the bare host: with launcher.slurm.container_type none and launcher.python empty, every
step runs the Python `rlkit submit` itself runs under (rlkit.launch.plan). A login-node install (scripts/install.sh)
holds rlkit's login side only: no torch, no transformers, no engine. Its job would queue, start, and fail on every
node with a ModuleNotFoundError. Looked up here with importlib's find_spec, which imports nothing (the login side
stays light): a site problem, so `rlkit submit` refuses it and `rlkit render` lists it as a warning.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec
from typing import TYPE_CHECKING

from rlkit.config.allocation import Allocation
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.served_models import served_auxiliary_models

if TYPE_CHECKING:
    from rlkit.jobs.base import JobType

_FIX = ("set launcher.python to a Python every node runs that has rlkit[trainer] and the engine (a venv on the shared "
        "filesystem; an engine in a venv of its own: vllm.python / sglang.python), or run the steps in images: "
        "launcher.slurm.container_type=apptainer with trainer_image and inference_server_image")


def validate_host_python(config: ExperimentConfig, job: JobType, allocation: Allocation, problems: Problems) -> None:
    """Add one problem naming each package the job's steps import that this interpreter does not have, and which
    steps need it."""
    if config.launcher.slurm.container_type != "none" or config.launcher.python.strip():
        return
    needs: dict[str, list[str]] = {}
    if allocation.trainer is not None:
        for name in ("torch", "transformers"):
            needs.setdefault(name, []).append("the trainer")
    elif job.needs_servers:  # job type generate: its client step tokenizes the prompts
        needs.setdefault("transformers", []).append("the client step")
    backends = [allocation.server.backend] if allocation.server is not None else []
    backends += [model.backend for model in served_auxiliary_models(config)]
    for backend in dict.fromkeys(backends):
        section = getattr(config, backend, None)
        if section is not None and not str(getattr(section, "python", "")).strip():
            needs.setdefault(backend, []).append(f"the {backend} servers: {backend}.python is empty")
    missing = [name for name in needs if find_spec(name) is None]
    if missing:
        which = "; ".join(f"{name} ({', '.join(needs[name])})" for name in missing)
        problems.add(f"launcher.python is empty and launcher.slurm.container_type none: the job's steps would run "
                     f"this Python ({sys.executable}), which has no {which}", hint=_FIX, site=True)
