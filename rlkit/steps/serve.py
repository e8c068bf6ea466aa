"""In-job step `rlkit serve`: one inference server (vLLM or SGLang) on a free port, registered in name resolve.

The server gets the trial token the way its backend takes it (`ServerBackend.launch`: vLLM from its environment,
SGLang from a 0600 config file), never argv; every route but /health needs it. The step registers `servers/<index>`
only once the server is healthy AND has refused a request without the token (rlkit.servers.guard_check): a server
that answers one is stopped and the step exits with NO_RETRY_EXIT, which the batch script does not retry. Refused
extra_args stop the step before anything starts. The entry is kept alive with a heartbeat while the server runs,
removed on exit; SIGTERM/SIGINT go to the server. The server's stdout+stderr reach the step's output (the trial's
server log) only through rlkit.servers.log_redact, with the token blanked: engines print their arguments. Until the
server is healthy its lines are also read for a known reason not to start (rlkit.servers.startup_failure): one that
no restart can fix (the KV cache does not fit) ends the step with NO_RETRY_EXIT and the reason in rlkit's keys.

With `auxiliary`, the step serves one of `auxiliary_models` instead of the policy: the same guard, health check and
heartbeat, its own model and size, registered as `auxiliary/<name>/<index>`, where rollouts and weight updates never
look (so it is never sent weights), and started without LoRA or a weight-transfer group.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from rlkit.config.allocation import parse_allocation
from rlkit.config.load import load_config
from rlkit.config.schema.auxiliary import AuxiliaryModelConfig
from rlkit.config.schema.experiment import ExperimentConfig, set_field
from rlkit.config.served_models import is_reward_servers, served_auxiliary_models
from rlkit.errors import FatalStepError, StepError
from rlkit.nameresolve import name_resolve_for, server_key
from rlkit.nameresolve.servers import server_step_name
from rlkit.servers.backend import ServerBackend, ServerLaunch, backend_for, server_model
from rlkit.servers.engine_env import engine_env, engine_python, missing_python
from rlkit.servers.guard_check import prove_guard
from rlkit.servers.health import ServerNotHealthy, find_free_port, wait_healthy
from rlkit.servers.log_redact import popen_redacted
from rlkit.servers.scratch import EngineScratch
from rlkit.servers.stale_scratch import remove_stale
from rlkit.servers.startup_failure import StartupWatch, served_with
from rlkit.slurm.jobenv import JobEnv, advertised_host
from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import read_token

LAST_OUTPUT_TIMEOUT = 5.0  # s to wait, once the server is gone, for its last lines (its children may hold the pipe)


def refuse_bad_extra_args(config: ExperimentConfig, backend: ServerBackend) -> None:
    """Refuse (exit NO_RETRY_EXIT, every problem listed) a `<backend>.extra_args` with a refused entry."""
    problems = backend.extra_args_problems(dict(getattr(config, backend.name).extra_args))
    if problems:
        listed = "\n".join(f"  {field}: {message}" for field, message in problems)
        raise FatalStepError(f"refused {backend.name} extra_args (nothing was started):\n{listed}")


def server_launch(config: ExperimentConfig, backend: ServerBackend, tp: int, port: int, *, token: str,
                  secret_dir: Path, index: int) -> ServerLaunch:
    """The server's argv and environment additions, from the config (refused extra_args stop here): the engine runs
    with `<backend>.python` (else this interpreter) and gets `<backend>.env_vars` under the backend's own variables
    (rlkit.servers.engine_env). A python this node cannot run stops the step before anything starts."""
    refuse_bad_extra_args(config, backend)
    python = engine_python(config, backend, sys.executable)
    if missing_python(python):
        raise FatalStepError(f"{backend.name}.python '{python}' cannot be run on this node (nothing was started); "
                             f"give the python of the {backend.name} install on the shared filesystem, or leave "
                             "it empty")
    launch = backend.launch(config, python=python, model=server_model(config, backend.name), host="0.0.0.0",
                            port=port, tp=tp, token=token, secret_dir=secret_dir, index=index)
    return dataclasses.replace(launch, env={**engine_env(config, backend), **launch.env})


def launch_env(launch: ServerLaunch, scratch: EngineScratch | None = None) -> dict[str, str]:
    """This process's environment with the engine's scratch directory (rlkit.servers.scratch), the launch's
    additions (a TMPDIR of `<backend>.env_vars` wins) and without the variables it unsets."""
    env = {**os.environ, **(scratch.env if scratch else {}), **launch.env}
    for name in launch.unset_env:
        env.pop(name, None)
    return env


def auxiliary_server_config(config: ExperimentConfig, entry: AuxiliaryModelConfig) -> ExperimentConfig:
    """The config an auxiliary model's server is started from: its backend's section with the entry's model and
    context length, and nothing of the policy's training (no LoRA adapters, no weight-transfer group)."""
    derived = copy.deepcopy(config)
    backend = backend_for(entry.backend)
    set_field(derived, backend.model_field, entry.model_path)
    set_field(derived, backend.context_field, entry.max_model_len)
    derived.actor.use_lora = False
    derived.actor.weight_update_mode = "disk"  # the servers' start does not join a broadcast group
    if is_reward_servers(config, entry.name):  # scores tokens (rlkit.rewards.model_reward), generates nothing
        derived.vllm.extra_args = {**derived.vllm.extra_args, "runner": "pooling"}
    return derived


def _what_to_serve(config: ExperimentConfig, index: int, auxiliary: str) -> tuple[ExperimentConfig, str, int]:
    """(the config the server starts from, its backend, its tensor-parallel size) for server `index`."""
    if auxiliary:
        entry = next((e for e in served_auxiliary_models(config) if e.name == auxiliary), None)
        if entry is None or not 0 <= index < entry.engine_num:
            raise StepError(f"auxiliary server {auxiliary}/{index} is not part of the trial's auxiliary_models "
                            "(nor the reward model's servers)")
        return auxiliary_server_config(config, entry), entry.backend, entry.tensor_parallel_size
    alloc = parse_allocation(config.allocation_mode)
    if alloc.server is None or not 0 <= index < alloc.server.dp:
        raise StepError(f"server index {index} is not part of allocation_mode {config.allocation_mode}")
    return config, alloc.server.backend, alloc.server.tp


def run_server(trial_dir: Path, index: int, auxiliary: str = "") -> int:
    """Run server `index` of the trial (of auxiliary model `auxiliary` when given) until it exits or the step is
    told to stop; return the exit code."""
    paths = TrialPaths(Path(trial_dir))
    config, backend_name, tp = _what_to_serve(load_config(paths.config), index, auxiliary)
    backend = backend_for(backend_name)
    token = read_token(paths)
    port = find_free_port("0.0.0.0")
    # secrets the server reads from a file (SGLang's key) go beside the trial token; an auxiliary model's in a
    # directory of its own (the files are named by server index)
    secret_dir = paths.token.parent / f"auxiliary-{auxiliary}" if auxiliary else paths.token.parent
    secret_dir.mkdir(mode=0o700, exist_ok=True)
    launch = server_launch(config, backend, tp, port, token=token, secret_dir=secret_dir, index=index)
    slurm = JobEnv.from_environ()
    key = server_key(index, auxiliary)
    stale = remove_stale(Path(tempfile.gettempdir()), prefix="rlkit-serve-")
    if stale:
        what = "directory" if len(stale) == 1 else "directories"
        print(f"rlkit serve: removed {len(stale)} temporary {what} of this user's killed servers on this node "
              f"({', '.join(p.name for p in stale[:3])}{', ...' if len(stale) > 3 else ''})", flush=True)
    scratch = EngineScratch.create(f"serve-{slurm.job_id or 'local'}-{key}")
    argv, env = launch.argv, launch_env(launch, scratch)
    node = slurm.node_name
    print(slurm.slice_line(server_step_name(index, auxiliary or "")), flush=True)
    what = f"auxiliary server {auxiliary}/{index}" if auxiliary else f"server {index}"
    print(f"rlkit serve: {what} ({backend.name}, tp={tp}) on node {node} at {advertised_host()}:{port}",
          flush=True)
    # the server's output reaches our log only through the copy, the token blanked (engines print their arguments)
    try:
        watch = StartupWatch(served_with(config, backend.name, tp, auxiliary))
        proc, output = popen_redacted(argv, [token], env=env, on_line=watch.see, preexec_fn=_die_with_parent)
    except BaseException:
        scratch.remove()
        raise
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        print(f"rlkit serve: got signal {signum}; stopping {what}", flush=True)
        proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    nr = name_resolve_for(config)
    not_started: ServerNotHealthy | None = None
    try:
        started = time.monotonic()
        wait_healthy(f"http://127.0.0.1:{port}", config.launcher.server_startup_timeout, process=proc,
                     gave_up=watch.hopeless)
        watch.stop()
        output.stop_watching()  # the engine's later lines need no reading (a busy server logs a lot)
        prove_guard(f"http://127.0.0.1:{port}", backend, token)  # before anyone can find it in name resolve
        entry = {
            "index": index, "address": f"{advertised_host()}:{port}", "backend": backend.name,
            "model": server_model(config, backend.name), "weight_version": 0,
            "job_id": slurm.job_id, "step_id": slurm.step_id,
            "node": node, "pid": proc.pid,
            "started_at": time.time(),
        }
        nr.add(key, json.dumps(entry), replace=True, keepalive=True)
        print(f"rlkit serve: {what} healthy and guarded after {time.monotonic() - started:.1f} s; registered "
              f"{key}; its temporary files in {scratch.path} ({scratch.entries()} entries)", flush=True)
        rc = proc.wait()
    except BaseException as exc:
        if stopping:
            rc = 0
        else:
            proc.terminate()
            not_started = exc if isinstance(exc, ServerNotHealthy) else None
            raise
    finally:
        nr.close()
        _reap(proc)
        output.join(LAST_OUTPUT_TIMEOUT)  # the engine's last lines (a failed start's reason among them)
        print(f"rlkit serve: removed {scratch.path} ({scratch.remove()} entries left in it)", flush=True)
        if not_started is not None:
            watch.judge(not_started)  # FatalStepError, in place of the failed wait, when no restart can fix it
    if stopping:
        return 0
    print(f"rlkit serve: {what} exited with code {rc}", flush=True)
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
