"""What the verifiers program prints besides its replies must not end rlkit's reading of it: a library writing text
that looks like deeply nested JSON, or a line past the pipe reader's limit, once stopped the reader task (a
RecursionError, a ValueError) while the program lived on, so every later episode waited its whole timeout and was
dropped. A stand-in program (plain Python, no verifiers) prints such a line before each reply."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

import rlkit.agent.verifiers_worker as worker_module
from rlkit.agent.verifiers_worker import VerifiersWorker

PROGRAM = '''
import json, sys
for line in sys.stdin:
    spec = json.loads(line)
    sys.stdout.write({noise} + "\\n")
    sys.stderr.write({noise} + "\\n")
    sys.stdout.write(json.dumps({{"id": spec["id"], "result": {{"ok": True, "task": spec["task"]}}}}) + "\\n")
    sys.stdout.flush()
    sys.stderr.flush()
'''


@pytest.mark.parametrize("noise", ['"[" * 100_000 + "]" * 100_000', '"x" * ((1 << 26) + 10)'],
                         ids=["nested past the stack", "past the reader's limit"])
def test_noise_on_the_programs_output_does_not_stop_episodes(noise: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM.format(noise=noise))
    monkeypatch.setattr(worker_module, "PROGRAM", program)

    async def main() -> list[dict[str, object]]:
        worker = VerifiersWorker(sys.executable)
        try:
            return [await worker.episode({"task": task}, 20.0) for task in (0, 1)]
        finally:
            await worker.stop()

    started = time.monotonic()
    assert asyncio.run(main()) == [{"ok": True, "task": 0}, {"ok": True, "task": 1}]
    assert time.monotonic() - started < 15, "answered as they came, not at the timeout"


def test_an_episode_the_program_does_not_read_is_dropped_at_its_timeout(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A program stuck without reading its stdin: a spec larger than the pipe's buffer waited in `drain`, outside
    the episode's deadline, for as long as the program lived (here 3 s, then it exits: the test fails, not hangs)."""
    program = tmp_path / "program.py"
    program.write_text("import time\ntime.sleep(3)\n")
    monkeypatch.setattr(worker_module, "PROGRAM", program)

    async def main() -> str:
        worker = VerifiersWorker(sys.executable)
        try:
            await worker.episode({"task": "x" * (1 << 20)}, 0.3)
        except worker_module.EpisodeDropped as exc:
            return str(exc)
        finally:
            await worker.stop()
        return "answered"

    started = time.monotonic()
    assert asyncio.run(main()) == "the verifiers episode ran past rollout.agent.verifiers.timeout (0.3 s)"
    assert time.monotonic() - started < 2
