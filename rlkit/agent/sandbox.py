"""Starting the code tool's child (rlkit/agent/sandbox_child.py), reading its output within a cap and a deadline,
and killing all of it: the parent half of the sandbox, with no policy about what the result means."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.agent.sandbox_child import memfd_holding

CHILD_SOURCE = (Path(__file__).parent / "sandbox_child.py").read_text(encoding="utf-8")
GUARD_SOURCES = {name: (Path(__file__).parent / f"{name}.py").read_text(encoding="utf-8")  # run by the guard
                 for name in ("sandbox_seccomp", "sandbox_mounts", "sandbox_opens")}
MAX_SPEC_BYTES = 120_000  # the code and its settings: a sanity bound (model output, not a file upload)
STATUS_CAP = 65_536
STOP_GRACE_SECONDS = 2.0  # for the supervisor to kill and reap its guard before we SIGKILL everything
TICK_SECONDS = 0.02  # how often the exit is checked when the kernel offers no pidfd


@dataclass(frozen=True)
class ChildSpec:
    """What the child needs: who to run as, its limits, the interpreter, the code and its environment."""

    python: str
    uid: int | None
    gid: int | None
    namespaces: bool
    cpu_seconds: int
    memory_bytes: int
    file_bytes: int
    code: str
    env: dict[str, str]
    hide: tuple[str, ...] = ()  # paths the code must not see (covered in its mount namespace)
    scratch_bytes: int = 256 * 1024 * 1024  # the run's in-memory scratch directory (tmpfs) holds at most this
    required: bool = True  # isolation that does not hold refuses the run (rollout.agent.code_tool.isolation)

    def serialized(self, status_fd: int) -> str:
        """The supervisor's spec, sent through a memfd (never argv: `ps` shows argv to every local user)."""
        return json.dumps(
            {
                "mode": "supervise", "python": self.python, "uid": self.uid, "gid": self.gid,
                "namespaces": self.namespaces, "required": self.required, "cpu_seconds": self.cpu_seconds,
                "memory_bytes": self.memory_bytes, "file_bytes": self.file_bytes, "code": self.code, "env": self.env,
                "scratch_bytes": self.scratch_bytes,
                "status_fd": status_fd, "hide": list(self.hide), "source": CHILD_SOURCE,
                "sources": GUARD_SOURCES,
            },
            ensure_ascii=False,
        )


@dataclass
class ChildRun:
    """How one run went, as the parent saw it: output (at most the cap), why it was stopped, the guard's facts."""

    output: bytes = b""
    stopped_for: str | None = None  # "time" or "output": the parent killed it
    seconds: float = 0.0
    facts: dict[str, Any] = field(default_factory=dict)
    start_error: str | None = None


def fits_in_argument(spec: ChildSpec) -> bool:
    return len(spec.serialized(0).encode("utf-8", "surrogatepass")) <= MAX_SPEC_BYTES


def run_child(spec: ChildSpec, *, scratch: Path, wall_seconds: float, output_bytes: int) -> ChildRun:
    """Run the child in its own session with stdout+stderr on one pipe; never raise for anything the child does."""
    started = time.monotonic()
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    spec_fd = memfd_holding("rlkit-code-tool-spec", spec.serialized(status_w).encode("utf-8", "surrogatepass"),
                            inheritable=False)
    try:
        proc = subprocess.Popen(  # the code is data in the JSON spec the memfd holds
            [spec.python, "-I", "-u", "-c", CHILD_SOURCE, json.dumps({"mode": "supervise", "fd": spec_fd})],
            stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w, pass_fds=(status_w, spec_fd), cwd=scratch,
            env=spec.env, start_new_session=True,
        )
    except (OSError, ValueError) as exc:
        for fd in (out_r, out_w, status_r, status_w, spec_fd):
            os.close(fd)
        return ChildRun(start_error=f"the code tool could not start {spec.python}: {exc}")
    os.close(out_w)
    os.close(status_w)
    os.close(spec_fd)
    run = ChildRun()
    try:
        run.output, run.stopped_for = _collect(proc.pid, out_r, started + wall_seconds, output_bytes)
    finally:
        _stop_and_reap(proc)
        os.close(out_r)
    run.seconds = time.monotonic() - started
    run.facts = _read_facts(status_r)
    os.close(status_r)
    return run


def _collect(pid: int, out_r: int, deadline: float, cap: int) -> tuple[bytes, str | None]:
    """Read the output until EOF, then wait for the exit, both before the deadline; keep at most the cap (one byte
    past it stops the run), so memory stays bounded and a child that floods the pipe never blocks us."""
    output = bytearray()
    while True:  # EOF comes when the last writer is gone: the guard and the runner are dead by then
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return bytes(output), "time"
        if not _readable(out_r, remaining):
            continue
        chunk = os.read(out_r, 65_536)
        if not chunk:
            break
        output += chunk[: cap + 1 - len(output)]
        if len(output) > cap:
            return bytes(output[:cap]), "output"
    return bytes(output), None if _wait_for_exit(pid, deadline) else "time"


def _wait_for_exit(pid: int, deadline: float) -> bool:
    """Whether the process exited before the deadline (left a zombie: see _has_exited)."""
    pidfd = _open_pidfd(pid)
    try:
        while not _has_exited(pid):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if pidfd is None:
                time.sleep(min(remaining, TICK_SECONDS))
            else:
                _readable(pidfd, remaining)
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _readable(fd: int, timeout: float) -> bool:
    """poll(2), not select(2): a busy rollout process may hold file descriptors above select's 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(timeout, 0.0) * 1000))


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # kernels before 5.3: fall back to ticks
        return None


def _has_exited(pid: int) -> bool:
    """True once the supervisor is a zombie; WNOWAIT keeps it one, so its process group id stays ours to kill."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _stop_and_reap(proc: subprocess.Popen[bytes]) -> None:
    """Ask the supervisor to kill its guard and wait for it (the guard ends only when every process of its pid
    namespace has ended), then SIGKILL the whole process group in any case and reap. Both signals go out
    before the supervisor is reaped, so its pid and group id cannot have been reused."""
    if not _has_exited(proc.pid):
        os.kill(proc.pid, signal.SIGTERM)
        _wait_for_exit(proc.pid, time.monotonic() + STOP_GRACE_SECONDS)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read_facts(status_r: int) -> dict[str, Any]:
    """The guard's JSON lines, merged; every writer is gone, so this never blocks."""
    raw = bytearray()
    while len(raw) < STATUS_CAP:
        chunk = os.read(status_r, STATUS_CAP)
        if not chunk:
            break
        raw += chunk
    facts: dict[str, Any] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        try:
            fact = json.loads(line)
        except ValueError:
            continue
        if isinstance(fact, dict):
            facts.update(fact)
    return facts
