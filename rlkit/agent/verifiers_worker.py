"""The run's verifiers program (rlkit/agent/verifiers_program.py), started once and fed one episode per line.

One process for the run, not one per episode: importing verifiers and loading an environment costs ~10 CPU-s, more
than an episode of a small model. Episodes run concurrently in it; each line written is answered by a line with the
same id. When the program exits, every episode waiting on it is dropped with its last lines of stderr, and the next
episode starts it again. It is started in a process group of its own and exits when its stdin closes (the trainer
stopped); `stop` ends it (the group) at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import tempfile
import weakref
from collections import deque
from pathlib import Path
from typing import Any

from rlkit import untrusted_json
from rlkit.agent.episode import EpisodeDropped, cannot_start
from rlkit.errors import FatalStepError

PROGRAM = Path(__file__).with_name("verifiers_program.py")
TASKSETS = Path(__file__).with_name("verifiers_tasksets")  # rlkit's example tasksets, for the verifiers venv only
STDERR_LINES = 20  # of the program's stderr kept, for the reason of a drop


def program_env(python: str, tmpdir: str) -> dict[str, str]:
    """The program's environment: the venv's bin first on PATH (verifiers finds the venv's `uv` there instead of
    downloading one from astral.sh), rlkit's example tasksets last on PYTHONPATH (the user's come first), the
    offline uv settings, and TMPDIR: the run's own directory (0700), since uv makes its script lock
    <tmp>/uv-<hash of the script>.lock writable by everyone (0666, to share it between users): in a shared /tmp two
    users' runs of one verifiers install took the same lock, and either could hold the other's episodes."""
    path = f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    pythonpath = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH", ""), str(TASKSETS)]))
    return {**os.environ, "PATH": path, "PYTHONPATH": pythonpath, "TMPDIR": tmpdir, **offline_uv(python)}


def offline_uv(python: str) -> dict[str, str]:
    """uv settings that make verifiers' `uv sync --script` (its harness's chat program) install from the wheelhouse
    scripts/verifiers-env.sh put beside the venv, with no network: find-links there, an empty default index (uv has no
    variable for --no-index) and no Python downloads. Nothing when there is no wheelhouse."""
    wheels = Path(python).parent.parent.parent / "wheelhouse"
    if not (wheels / ".complete").is_file():
        return {}
    return {"UV_FIND_LINKS": str(wheels), "UV_DEFAULT_INDEX": (wheels / "empty-index").as_uri(),
            "UV_PYTHON_DOWNLOADS": "never"}


class VerifiersWorker:
    """The program for one event loop; `episode(spec, timeout)` returns its result or raises EpisodeDropped."""

    def __init__(self, python: str) -> None:
        self.python = python
        self._proc: asyncio.subprocess.Process | None = None
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count()
        self._stderr: deque[str] = deque(maxlen=STDERR_LINES)
        self._starting = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._tmpdir: str | None = None  # the program's TMPDIR (program_env), made at its first start
        self._remove_tmpdir: weakref.finalize[..., Any] | None = None  # at stop, else when this process exits

    async def _started(self) -> asyncio.subprocess.Process:
        async with self._starting:
            if self._proc is None or self._proc.returncode is not None:
                try:
                    if self._tmpdir is None:
                        self._tmpdir = tempfile.mkdtemp(prefix="rlkit-verifiers-")
                        self._remove_tmpdir = weakref.finalize(self, shutil.rmtree, self._tmpdir, True)
                    self._proc = await asyncio.create_subprocess_exec(
                        self.python, str(PROGRAM), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE, env=program_env(self.python, self._tmpdir),
                        start_new_session=True, limit=1 << 26)
                except OSError as exc:
                    why = f"the verifiers program could not start under {self.python}: {exc}"
                    if cannot_start(exc):
                        raise FatalStepError(f"{why}; fix: install the venv with scripts/verifiers-env.sh, or set "
                                             "rollout.agent.verifiers.python to its interpreter") from exc
                    raise EpisodeDropped(why) from exc
                proc = self._proc
                self._tasks = [asyncio.create_task(self._read(proc)), asyncio.create_task(self._drain(proc))]
            return self._proc

    async def episode(self, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
        proc = await self._started()
        number = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[number] = future
        assert proc.stdin is not None
        async def send_and_wait() -> dict[str, Any]:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({**spec, "id": number}).encode() + b"\n")
            await proc.stdin.drain()  # a program that stopped reading fills the pipe: within the deadline too
            return await future

        try:
            return await asyncio.wait_for(send_and_wait(), timeout)
        except (BrokenPipeError, ConnectionResetError):
            raise EpisodeDropped(f"the verifiers program exited: {self._said()}") from None
        except TimeoutError:
            raise EpisodeDropped(f"the verifiers episode ran past rollout.agent.verifiers.timeout ({timeout:g} s)") \
                from None
        finally:
            self._waiting.pop(number, None)

    def _said(self) -> str:
        return " | ".join(list(self._stderr)[-3:]) or "no output"

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while True:
            try:
                line = await proc.stdout.readline()
            except ValueError:  # a line past the stream's limit (dropped by readline): not a reply
                continue
            if not line:
                break
            try:
                # a library printing "[[[[..." must not end this reader (every episode would then wait its timeout)
                reply = untrusted_json.loads(line)
            except ValueError:
                continue  # not a reply (a library printing to stdout)
            number = reply.get("id") if isinstance(reply, dict) else None
            future = self._waiting.get(number) if isinstance(number, int) else None
            if future is None or future.done():
                continue  # an episode that timed out meanwhile
            if "error" in reply:
                future.set_exception(EpisodeDropped(f"the verifiers episode failed: {reply['error']}"))
            else:
                future.set_result(reply.get("result") or {})
        await proc.wait()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(EpisodeDropped(f"the verifiers program exited with code {proc.returncode}: "
                                                    f"{self._said()}"))

    async def _drain(self, proc: asyncio.subprocess.Process) -> None:
        """Read stderr as it comes (a full pipe would stop the program), keeping its last lines."""
        assert proc.stderr is not None
        while True:
            try:
                line = await proc.stderr.readline()
            except ValueError:  # a line past the stream's limit: kept short, and the pipe goes on being read
                self._stderr.append("(a line too long to keep)")
                continue
            if not line:
                break
            if line.strip():
                self._stderr.append(line.decode(errors="replace").strip()[:300])

    async def stop(self) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._remove_tmpdir is not None:  # the trainer may also just exit: the finalizer runs then
            self._remove_tmpdir()
            self._tmpdir = self._remove_tmpdir = None
