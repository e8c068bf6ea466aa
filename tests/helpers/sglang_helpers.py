"""Test helper (not a conftest): a REAL SGLang 0.5.23 server on the CPU, started through rlkit's SGLang backend.

The server runs from its own venv (scripts/sglang-env.sh; `RLKIT_SGLANG_PYTHON` names another python) with argv and
environment from `rlkit.servers.sglang.backend.BACKEND.launch` (the token in a 0600 `--config` file), plus what only
this CPU needs: `SGLANG_USE_CPU_ENGINE=1`, `--device cpu`, and tests/sglang_cpu_shim first on PYTHONPATH, a test-only
stand-in for the one CUDA-only kernel SGLang's CPU engine calls (see its docstring).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlkit.config.schema.experiment import ExperimentConfig, SGLangConfig
from rlkit.servers.backend import Server
from rlkit.servers.health import ServerNotHealthy, find_free_port, wait_healthy
from rlkit.servers.scratch import EngineScratch
from rlkit.servers.sglang.backend import BACKEND
from tests.conftest import REPO
from tests.helpers.lora_served import TARGETS
from tests.helpers.vllm_helpers import _tail, stop_group

SHIM = REPO / "tests" / "sglang_cpu_shim"
PIN_SHIM = REPO / "tests" / "sglang_cpu_pin_shim"  # SGLang's LoRA path pins host memory, which needs CUDA
HOST = "127.0.0.1"
HEALTH_TIMEOUT = 300.0
LORA_RANK = 8
CPU_EXTRA_ARGS: dict[str, object] = {  # what a CPU without GPUs needs (shared/NOTES.md)
    "device": "cpu",
    "disable_overlap_schedule": True,
    "max_total_tokens": 4096,
    # SGLang's scheduler otherwise spins while idle: the session's server took 900 CPU-s of a suite run that way
    "sleep_on_idle": True,
}


def sglang_python() -> str:
    """The python of the SGLang venv: $RLKIT_SGLANG_PYTHON, else `scripts/sglang-env.sh --check`. Fails the test
    (never skips) with how to install it when SGLang 0.5.23 is not there."""
    given = os.environ.get("RLKIT_SGLANG_PYTHON")
    if given:
        return given
    check = subprocess.run(["bash", str(REPO / "scripts" / "sglang-env.sh"), "--check"], capture_output=True,
                           text=True, check=False, timeout=60)
    if check.returncode != 0:
        pytest.fail(f"SGLang 0.5.23 is not installed for the sglang tests: {check.stderr.strip()}\n"
                    "  run `bash scripts/sglang-env.sh` once (or set RLKIT_SGLANG_PYTHON to a python with "
                    "sglang==0.5.23), or deselect them with -m 'not sglang'", pytrace=False)
    return check.stdout.strip().splitlines()[-1]


def cpu_config(model_dir: Path) -> ExperimentConfig:
    """A config whose sglang section serves `model_dir` in float32 on this CPU."""
    return ExperimentConfig(experiment_name="sglang-test", trial_name="t1", allocation_mode="sglang:d1",
                            sglang=SGLangConfig(model_path=str(model_dir), dtype="float32",
                                                extra_args=dict(CPU_EXTRA_ARGS)))


def lora_server_config(model_dir: Path) -> ExperimentConfig:
    """`cpu_config` with `actor.use_lora`: the backend adds `--enable-lora --max-lora-rank --lora-target-modules`
    (and `--lora-backend torch_native` on this CPU). The session's one SGLang server (tests/conftest.py
    `sglang_server`) is started from it: the contract tests run on it too, LoRA on or off changes none of them."""
    config = cpu_config(model_dir)
    config.experiment_name = "sglang-lora"
    config.actor.path, config.actor.dtype = str(model_dir), "float32"
    config.actor.use_lora, config.actor.lora_rank, config.actor.lora_alpha = True, LORA_RANK, 16
    config.actor.target_modules = list(TARGETS)
    return config


@dataclass(frozen=True)
class RunningSglang:
    server: Server
    token: str
    model_dir: Path
    argv: list[str]
    key_file: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    start_seconds: float


@contextlib.contextmanager
def running_sglang(model_dir: Path, *, token: str, workdir: Path, python: str, timeout: float = HEALTH_TIMEOUT,
                   config: ExperimentConfig | None = None, shims: tuple[Path, ...] = ()) -> Iterator[RunningSglang]:
    """Start one SGLang server of `model_dir` through `BACKEND.launch` (of `config`, by default `cpu_config`); stop its
    process group when the block ends. `shims`: more test-only directories, first on its PYTHONPATH."""
    import time

    secret_dir = workdir / "secrets"
    secret_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    port = find_free_port(HOST)
    launch = BACKEND.launch(config or cpu_config(model_dir), python=python, model=str(model_dir), host=HOST, port=port,
                            tp=1, token=token, secret_dir=secret_dir, index=0)
    env = {k: v for k, v in os.environ.items() if k not in launch.unset_env}
    env.update(launch.env)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*map(str, shims), str(SHIM), env.get("PYTHONPATH", "")]))
    scratch = EngineScratch.create("test-sglang", parent=str(workdir))  # its sockets, as the serve step does
    env.update(scratch.env)
    log = workdir / f"sglang-{model_dir.name}.log"
    url = f"http://{HOST}:{port}"
    started = time.monotonic()
    with log.open("ab") as log_file:
        process = subprocess.Popen(launch.argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True)
    try:
        try:
            wait_healthy(url, timeout, process=process)
        except ServerNotHealthy as exc:
            raise ServerNotHealthy(f"{exc}\n--- last lines of {log} ---\n{_tail(log)}") from exc
        server = Server(index=0, address=f"{HOST}:{port}", model=str(model_dir), backend="sglang")
        yield RunningSglang(server=server, token=token, model_dir=model_dir, argv=launch.argv,
                            key_file=secret_dir / "sglang-0.yaml", process=process, log_path=log,
                            start_seconds=time.monotonic() - started)
    finally:
        stop_group(process)
        scratch.remove()
