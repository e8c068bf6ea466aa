"""An episode program that cannot start for good (missing, or not this user's to run) stops the run with the fix; a
start that may pass (out of processes) drops only the episode. A verifiers venv never installed (an ordinary user's
~/.cache/rlkit-verifiers) had every group dropped, 5,800 in 10 minutes, the job at step 0 until its time limit."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import rlkit.agent.verifiers_worker as worker_module
from rlkit.agent.episode import EpisodeDropped
from rlkit.agent.openai_workflow import AgentProgram, OpenAIAgentWorkflow
from rlkit.agent.verifiers_worker import VerifiersWorker
from rlkit.errors import FatalStepError


async def _episode(python: str) -> Any:
    worker = VerifiersWorker(python)
    try:
        return await worker.episode({"task": 0}, 5.0)
    finally:
        await worker.stop()


def test_a_missing_verifiers_venv_stops_the_run_with_the_fix(tmp_path: Path) -> None:
    python = tmp_path / ".cache" / "rlkit-verifiers" / "venv" / "bin" / "python"
    with pytest.raises(FatalStepError, match=f"could not start under {python}.*fix: install the venv"):
        asyncio.run(_episode(str(python)))


def test_an_interpreter_this_user_may_not_run_stops_the_run(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o644)  # no execute bit for anyone: refused even to root
    with pytest.raises(FatalStepError, match="Permission denied"):
        asyncio.run(_episode(str(python)))


def test_a_start_that_may_pass_drops_only_the_episode(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_processes_left(*args: Any, **kwargs: Any) -> Any:
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(worker_module.asyncio, "create_subprocess_exec", no_processes_left)
    with pytest.raises(EpisodeDropped, match="temporarily unavailable"):
        asyncio.run(_episode(sys.executable))


def test_a_missing_agent_command_stops_the_run(tmp_path: Path) -> None:
    workflow = OpenAIAgentWorkflow(AgentProgram(None, (str(tmp_path / "no-agent"), "--flag"), 5.0))
    with pytest.raises(FatalStepError, match=r"no-agent' could not start.*fix: rollout\.agent\.openai\.command"):
        asyncio.run(workflow._run_command("http://127.0.0.1:1/e/k/v1", "k", {"prompt": "x"}))


def test_the_verifiers_program_has_a_private_temporary_directory(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """uv makes <tmp>/uv-<hash of the script>.lock writable by everyone: in a shared /tmp two users' programs took
    the same lock. The program's TMPDIR is the run's own (0700), removed when the worker stops."""
    program = tmp_path / "program.py"
    program.write_text("import json, os, sys, tempfile\nfor line in sys.stdin:\n"
                       "    tmp = tempfile.gettempdir(); info = os.stat(tmp)\n"
                       "    print(json.dumps({'id': json.loads(line)['id'], 'result': {'tmp': tmp, 'uid': info.st_uid,"
                       " 'mode': info.st_mode & 0o777}}), flush=True)\n")
    monkeypatch.setattr(worker_module, "PROGRAM", program)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the node's shared one

    async def main() -> list[dict[str, Any]]:
        worker = VerifiersWorker(sys.executable)
        try:
            return [await worker.episode({"task": task}, 20.0) for task in (0, 1)]
        finally:
            await worker.stop()

    first, second = asyncio.run(main())
    assert first == second and first["tmp"] != str(tmp_path) and Path(first["tmp"]).name.startswith("rlkit-verif")
    assert (first["uid"], first["mode"]) == (os.getuid(), 0o700)
    assert not Path(first["tmp"]).exists()  # removed at stop


def test_the_programs_temporary_directory_goes_when_the_trainer_exits_without_stop(tmp_path: Path) -> None:
    """The trainer ends its rollout loop without stopping the workflow (the program ends with its stdin): the
    directory is removed when the process exits, not left in /tmp once a run."""
    program = tmp_path / "program.py"
    program.write_text("import json, sys, tempfile\nfor line in sys.stdin:\n"
                       "    print(json.dumps({'id': json.loads(line)['id'], 'result': {'tmp': tempfile.gettempdir()}}),"
                       " flush=True)\n")
    trainer = ("import asyncio, sys\nfrom pathlib import Path\nimport rlkit.agent.verifiers_worker as w\n"
               f"w.PROGRAM = Path({str(program)!r})\n"
               "async def main():\n    worker = w.VerifiersWorker(sys.executable)\n"
               "    print((await worker.episode({'task': 0}, 20.0))['tmp'])\n"
               "    main.worker = worker  # alive until the interpreter exits\n"
               "asyncio.run(main())\n")
    done = subprocess.run([sys.executable, "-c", trainer], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    made = Path(done.stdout.strip().splitlines()[-1])
    assert made.parent == tmp_path and made.name.startswith("rlkit-verifiers-") and not made.exists()
