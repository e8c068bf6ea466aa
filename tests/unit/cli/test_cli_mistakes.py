"""A new user's mistakes at the CLI, made as they would make them, each through the real `python -m rlkit`: a closed
stdout or stderr (`>&-`, `2>&-`), a terminal that is not UTF-8, `logs -n 0` or `-n -5`, `stop --timeout nan`, an
RLKIT_HOME (or HOME) that cannot be written, a trial directory the user may not read. Each was a traceback or a
wrong answer; each is now one message and exit 2 (or the right output), with nothing written or submitted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit.cli.status import tail
from tests.conftest import CONFIGS, run_rlkit

REPO = Path(__file__).resolve().parents[3]


def _shell(line: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m rlkit ...` run by bash as a user's shell line, so it can close the command's own streams."""
    return subprocess.run(["bash", "-c", line, sys.executable], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={**os.environ, **(env or {})}, check=False)


@pytest.mark.parametrize("closed", [">&-", "2>&-", "<&- >&-"])
def test_a_closed_stream_keeps_exit_2_for_a_mistake_and_no_traceback(closed: str, tmp_path: Path) -> None:
    # Python leaves sys.stdout None when fd 1 is closed: the consoles failed at import (exit 1, a traceback)
    done = _shell(f'"$0" -m rlkit explain no_such_key {closed}', {"RLKIT_HOME": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    if "2>&-" not in closed:
        assert "error: unknown config key 'no_such_key'" in done.stderr, done.stderr


def test_a_closed_stdout_still_lets_a_good_command_succeed(tmp_path: Path) -> None:
    done = _shell('"$0" -m rlkit explain actor.eps_clip >&-', {"RLKIT_HOME": str(tmp_path)})
    assert (done.returncode, done.stderr) == (0, "")


def _trial(home: Path, root: Path, log: str) -> None:
    """A trial in the index at `home` whose batch log (job 7) holds `log`."""
    (root / "logs").mkdir(parents=True)
    (root / "logs" / "slurm-7.out").write_text(log, encoding="utf-8")
    (home / "trials" / "exp").mkdir(parents=True)
    record = {"experiment": "exp", "trial": "t1", "trial_dir": str(root), "job_id": "7", "submitted_at": time.time()}
    (home / "trials" / "exp" / "t1.json").write_text(json.dumps(record))


def test_render_and_logs_write_utf8_to_a_terminal_that_is_not(tmp_path: Path) -> None:
    # an ASCII or Latin-1 stdout (LANG=en_US.ISO-8859-1) raised UnicodeEncodeError on a non-ASCII value: a traceback
    _trial(tmp_path / "home", tmp_path / "trial", "step 1: reward 0.5\nmodel said: né 数\n")
    env = {"PYTHONIOENCODING": "ascii", "RLKIT_HOME": str(tmp_path / "home"), "RLKIT_DEMO_DIR": str(tmp_path)}
    logs = run_rlkit("logs", "exp/t1", "-n", "1", env=env)
    assert (logs.returncode, logs.stdout) == (0, "model said: né 数\n"), logs.stderr
    rendered = run_rlkit("render", str(CONFIGS / "generate-cpu-demo.yaml"), f"actor.path={tmp_path}/modèle",
                         f"cluster.fileroot={tmp_path}/fileroot", env=env)
    assert rendered.returncode == 0 and "Traceback" not in rendered.stderr, rendered.stderr
    assert f"{tmp_path}/modèle" in rendered.stdout


@pytest.mark.parametrize(("lines", "shown"), [("0", ""), ("2", "c\nd\n"), ("9", "a\nb\nc\nd\n")])
def test_logs_shows_the_last_n_lines_and_none_for_0(lines: str, shown: str, tmp_path: Path) -> None:
    _trial(tmp_path / "home", tmp_path / "trial", "a\nb\nc\nd\n")  # -n 0 printed the whole log ([-0:])
    done = run_rlkit("logs", "exp/t1", "-n", lines, env={"RLKIT_HOME": str(tmp_path / "home")})
    assert (done.returncode, done.stdout) == (0, shown), done.stderr


def test_logs_refuses_a_negative_count(tmp_path: Path) -> None:
    _trial(tmp_path / "home", tmp_path / "trial", "a\nb\nc\n")  # -n -1 printed all but the first line
    done = run_rlkit("logs", "exp/t1", "-n", "-1", env={"RLKIT_HOME": str(tmp_path / "home")})
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert "invalid value for '--lines'" in done.stderr.lower() and "Traceback" not in done.stderr


def test_tail_reads_a_long_log_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text("".join(f"line {i} é\n" for i in range(100_000)) + "no newline at the end")
    assert tail(log, 3) == ["line 99998 é", "line 99999 é", "no newline at the end"]
    assert tail(log, 0) == [] and tail(tmp_path / "none.log", 3) == []
    assert len(tail(log, 20_000)) == 20_000 and tail(log, 20_000)[0] == "line 80001 é"


@pytest.mark.parametrize("timeout", ["nan", "-1", "inf"])
def test_stop_refuses_a_timeout_that_is_no_wait(timeout: str, tmp_path: Path) -> None:
    done = run_rlkit("stop", "exp/t1", "--timeout", timeout, env={"RLKIT_HOME": str(tmp_path)})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"--timeout {float(timeout)} is not a number of seconds" in done.stderr and "fix: " in done.stderr
