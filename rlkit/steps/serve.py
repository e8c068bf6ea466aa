"""In-job step `rlkit serve`: one inference server (vLLM or SGLang) on a free port, registered in name resolve.

The server gets the trial token through its environment (vLLM) or a 0600 config file (SGLang), never argv; every
route but /health needs it. The step registers `servers/<index>` only once the server is healthy AND has refused a
request without the token (rlkit.servers.guard_check): a server that answers one is stopped and the step exits with
NO_RETRY_EXIT, which the batch script does not retry. Refused extra_args stop the step before anything starts. The
entry is kept alive with a heartbeat while the server runs, removed on exit; SIGTERM/SIGINT go to the server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from rlkit.config.allocation import parse_allocation
from rlkit.config.load import load_config
from rlkit.config.schema import ExperimentConfig
from rlkit.config.validate import server_model
from rlkit.errors import FatalStepError, StepError
from rlkit.nameresolve import name_resolve_for, server_key
from rlkit.paths import TrialPaths
from rlkit.servers.extra_args import SGLANG_FIELD_OPTIONS, VLLM_FIELD_OPTIONS, extra_args_problems
from rlkit.servers.guard_check import prove_guard
from rlkit.servers.health import find_free_port, wait_healthy
from rlkit.servers.sglang.command import sglang_command, write_key_file
from rlkit.servers.vllm.command import vllm_command, vllm_env
from rlkit.trials import read_token


def advertised_host() -> str:
    """The address other nodes use to reach this one ($RLKIT_ADVERTISE_HOST overrides the host name)."""
    return os.environ.get("RLKIT_ADVERTISE_HOST") or socket.gethostname()


def sglang_key_file(paths: TrialPaths, index: int, token: str) -> Path:
    """SGLang takes its api key from argv only; a 0600 `--config` file beside the token keeps it off argv."""
    return write_key_file(paths.token.parent / f"sglang-{index}.yaml", token)


def server_extra_args(config: ExperimentConfig, backend: str) -> dict[str, object]:
    """The user's `<backend>.extra_args`, refused (exit NO_RETRY_EXIT, every problem listed) if any entry is refused."""
    extra = dict(config.vllm.extra_args if backend == "vllm" else config.sglang.extra_args)
    problems = extra_args_problems(backend, extra)
    if problems:
        listed = "\n".join(f"  {field}: {message}" for field, message in problems)
        raise FatalStepError(f"refused {backend} extra_args (nothing was started):\n{listed}")
    return extra


def server_command(config: ExperimentConfig, backend: str, tp: int, port: int, *,
                   sglang_config: Path | None = None) -> list[str]:
    """The server's argv, from the config (SGLang needs `sglang_config`, the key file)."""
    model = server_model(config, backend)
    if backend == "vllm":
        v = config.vllm
        extra: dict[str, object] = {**{name: getattr(v, name) for name in VLLM_FIELD_OPTIONS},
                                    **server_extra_args(config, backend)}
        return vllm_command(python=sys.executable, model=model, host="0.0.0.0", port=port, served_model_name=None,
                            tensor_parallel_size=tp, extra=extra)
    if sglang_config is None:
        raise ValueError("an SGLang server needs its key file (sglang_key_file)")
    s = config.sglang
    extra = {**{name: getattr(s, name) for name in SGLANG_FIELD_OPTIONS}, **server_extra_args(config, backend)}
    return sglang_command(python=sys.executable, model=model, host="0.0.0.0", port=port, served_model_name=None,
                          tensor_parallel_size=tp, key_file=str(sglang_config), extra=extra)


def run_server(trial_dir: Path, index: int) -> int:
    """Run server `index` of the trial until it exits or the step is told to stop; return the exit code."""
    paths = TrialPaths(Path(trial_dir))
    config = load_config(paths.config)
    alloc = parse_allocation(config.allocation_mode)
    if alloc.server is None or not 0 <= index < alloc.server.dp:
        raise StepError(f"server index {index} is not part of allocation_mode {config.allocation_mode}")
    backend, tp = alloc.server.backend, alloc.server.tp
    token = read_token(paths)
    port = find_free_port("0.0.0.0")
    if backend == "vllm":
        argv, env = server_command(config, backend, tp, port), {**os.environ, **vllm_env(token)}
        env.pop("VLLM_API_KEY", None)  # vLLM would guard /v1 with this other key: rlkit's own clients would get 401
    else:
        key_file = sglang_key_file(paths, index, token)
        argv, env = server_command(config, backend, tp, port, sglang_config=key_file), dict(os.environ)
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    print(f"rlkit serve: server {index} ({backend}, tp={tp}) on node {node} at {advertised_host()}:{port}", flush=True)
    proc = subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent)
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        print(f"rlkit serve: got signal {signum}; stopping server {index}", flush=True)
        proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    nr = name_resolve_for(config)
    try:
        started = time.monotonic()
        wait_healthy(f"http://127.0.0.1:{port}", config.launcher.server_startup_timeout, process=proc)
        prove_guard(f"http://127.0.0.1:{port}", backend, token)  # before anyone can find it in name resolve
        entry = {
            "index": index, "address": f"{advertised_host()}:{port}", "backend": backend,
            "model": server_model(config, backend), "weight_version": 0,
            "job_id": os.environ.get("SLURM_JOB_ID", ""), "step_id": os.environ.get("SLURM_STEP_ID", ""),
            "node": node, "pid": proc.pid,
            "started_at": time.time(),
        }
        nr.add(server_key(index), json.dumps(entry), replace=True, keepalive=True)
        print(f"rlkit serve: server {index} healthy and guarded after {time.monotonic() - started:.1f} s; registered "
              f"{server_key(index)}", flush=True)
        rc = proc.wait()
    except BaseException:
        if stopping:
            rc = 0
        else:
            proc.terminate()
            raise
    finally:
        nr.close()
        _reap(proc)
    if stopping:
        return 0
    print(f"rlkit serve: server {index} exited with code {rc}", flush=True)
    return rc if rc != 0 else 1


def _die_with_parent() -> None:
    """In the server's child process: get SIGKILL when `rlkit serve` dies, even by SIGKILL (Linux
    PR_SET_PDEATHSIG), so a server whose step is gone never keeps serving unmanaged."""
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Make sure the server process is gone (TERM, then KILL after 30 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
