"""Which python an inference engine runs with and what its section adds to its environment (`vllm.python`,
`vllm.env_vars`, `sglang.python`, `sglang.env_vars`). Pure and light: validation, the serve step and the doctor use it.

Why per engine and not per role: one job may serve its policy with SGLang and an auxiliary model with vLLM, and on a
bare host (container_type none) each engine usually lives in a venv of its own (SGLang pins another torch than vLLM).
The serve step itself stays in launcher.python (rlkit's environment); only the engine's process is started with the
section's python and environment, so an SGLang venv needs no rlkit. vLLM imports rlkit in its process (the token guard,
the worker extension), so a `vllm.python` must have rlkit importable.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import TYPE_CHECKING

from rlkit.errors import ConfigError

if TYPE_CHECKING:
    from rlkit.config.problems import Problems
    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.servers.backend import ServerBackend

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env_vars(field: str, text: str) -> dict[str, str]:
    """'A=1,B=2' -> {'A': '1', 'B': '2'}; raises ConfigError on a malformed item."""
    env: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.fullmatch(name):
            raise ConfigError(f"{field}: '{item}' is not NAME=VALUE", hint=f"e.g. {field}='NCCL_DEBUG=WARN,A=1'")
        env[name] = value
    return env


def engine_python(config: ExperimentConfig, backend: ServerBackend, default: str) -> str:
    """`<backend>.python`, else `default` (the interpreter of the serve step)."""
    return str(getattr(config, backend.name).python) or default


def engine_env(config: ExperimentConfig, backend: ServerBackend) -> dict[str, str]:
    """`<backend>.env_vars` as a dict (validation refused malformed items and names the backend sets itself)."""
    return parse_env_vars(f"{backend.name}.env_vars", getattr(config, backend.name).env_vars)


def check_engine_env(config: ExperimentConfig, backend: ServerBackend, problems: Problems) -> None:
    """Add every problem with `<backend>.python` and `<backend>.env_vars` to `problems`, each with its fix.

    A variable the backend's launch sets or removes itself (the token, the routes rlkit needs) is refused: the user's
    value would silently lose. A python given as a path must be an executable file when steps run on the bare host
    (a site problem: the login node may not see the compute nodes' files; with containers the path is inside the
    server image and is not checked here). The serve step checks it again on its node."""
    section = getattr(config, backend.name)
    field = f"{backend.name}.env_vars"
    names: dict[str, str] = {}
    with problems.check():
        names = parse_env_vars(field, section.env_vars)
    for name in sorted(set(names) & set(backend.launch_env_names)):
        problems.add(f"{field}: {name} is set by rlkit itself for {backend.name} servers",
                     hint=f"remove {name} from {field}")
    python = str(section.python)
    if python and config.launcher.slurm.container_type == "none" and os.sep in python and not _runnable(python):
        problems.add(f"{backend.name}.python: '{python}' is not an executable file",
                     hint=f"give the python of the {backend.name} install on the shared filesystem (e.g. "
                          "<venv>/bin/python), or leave it empty", site=True)


def _runnable(python: str) -> bool:
    return os.path.isfile(python) and os.access(python, os.X_OK)


def missing_python(python: str) -> bool:
    """Whether `python` (a path, or a name looked up in PATH) cannot be run on this node."""
    return (not _runnable(python)) if os.sep in python else shutil.which(python) is None
