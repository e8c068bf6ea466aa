"""A new user's mistakes at the CLI, made as they would make them, each through the real `python -m rlkit`: a closed
stdout or stderr (`>&-`, `2>&-`), a terminal that is not UTF-8, `logs -n 0` or `-n -5`, `stop --timeout nan`, an
RLKIT_HOME (or HOME) that cannot be written, a trial directory the user may not read. Each was a traceback or a
wrong answer; each is now one message and exit 2 (or the right output), with nothing written or submitted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
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


@pytest.mark.parametrize(("text", "says"), [("- a\n- b\n", "not a list"), ("42\n", "not a number"),
                                           ("2026-01-01\n", "not a date")])
def test_a_config_of_one_value_names_what_it_holds_and_the_fix(text: str, says: str, tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(text)  # it said "not a int", with no fix
    done = run_rlkit("render", str(tmp_path / "c.yaml"), env={"RLKIT_HOME": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert f"must hold a mapping of keys to values, {says}\n  fix: write it as `key: value` lines" in done.stderr


def test_a_value_of_the_wrong_type_says_where_its_type_is_shown(tmp_path: Path) -> None:
    done = run_rlkit("render", str(CONFIGS / "grpo-cpu-demo.yaml"), "actor.optimizer.lr=abc",
                     env={"RLKIT_HOME": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert "wrong type for 'actor.optimizer.lr'" in done.stderr  # the error alone, with no fix, before
    assert "fix: `rlkit explain actor.optimizer.lr` shows its type and default" in done.stderr


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


@pytest.fixture
def fake_sbatch(tmp_path: Path) -> Path:
    """sbatch on PATH that accepts --test-only and records a real submission in the returned file (never made)."""
    bin_dir, submitted = tmp_path / "bin", tmp_path / "submitted"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\ncase \"$*\" in *--test-only*) echo 'sbatch: Job 1 to start' >&2; "
                                    f"exit 0;; esac\necho \"$*\" >> {submitted}\necho 7\n")
    (bin_dir / "sbatch").chmod(0o755)
    return submitted


def test_an_rlkit_home_that_is_a_file_refuses_submit_before_sbatch(generate_yaml: Path, fake_sbatch: Path,
                                                                   tmp_path: Path) -> None:
    home = tmp_path / "home-file"
    home.write_text("")  # HOME=/ of a service account, a RLKIT_HOME given a file: a PermissionError traceback
    env = {"RLKIT_HOME": str(home), "PATH": f"{fake_sbatch.parent / 'bin'}:{os.environ['PATH']}"}
    done = run_rlkit("submit", str(generate_yaml), "--no-preflight", env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"cannot write rlkit's per-user state directory {home}/locks" in done.stderr, done.stderr
    assert "fix: set RLKIT_HOME" in done.stderr
    assert not fake_sbatch.exists() and not (tmp_path / "fileroot").exists()


def _without_root_powers(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """rlkit as root with every capability dropped (an empty bounding set: none come back at exec): a directory
    another user owns with mode 0700 is then closed to it, as to any ordinary user, while root's own interpreter (its
    venv under a 0700 /root) still runs."""
    return subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-m", "rlkit",
                           *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False,
                          env={**os.environ, **env, "PYTHONPATH": str(REPO)})


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="root makes a trial another user owns")
def test_a_trial_directory_the_user_may_not_read_is_named() -> None:
    base = Path(tempfile.mkdtemp(prefix="rlkit-unreadable-"))  # /tmp: pytest's own tmp_path is 0700, root's
    try:
        _trial(base / "home", base / "trial", "a\n")
        for path in (base / "trial", *(base / "trial").rglob("*")):
            os.chown(path, 1000, 1000)
        (base / "trial").chmod(0o700)  # another user's trial, in this user's index (a shared or copied one)
        env = {"RLKIT_HOME": str(base / "home")}
        for args in (("logs", "exp/t1"), ("status", "exp/t1"), ("resume", "exp/t1")):
            done = _without_root_powers(*args, cwd=base, env=env)  # each was a PermissionError traceback
            assert done.returncode == 2 and "Traceback" not in done.stderr, (args, done.stderr)
            assert f"trial exp/t1: its directory {base / 'trial'} is not readable by you" in done.stderr, done.stderr
    finally:
        shutil.rmtree(base)


@pytest.mark.parametrize("value", ["relative/home", "~nosuchuser-rlkit/x"])
def test_a_relative_rlkit_home_is_refused_not_used_under_the_current_directory(value: str, tmp_path: Path) -> None:
    # RLKIT_HOME="~/x" quoted in a profile: the index and locks went under whatever directory rlkit ran in
    done = run_rlkit("status", env={"RLKIT_HOME": value})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"error: RLKIT_HOME '{value}' is not an absolute path" in done.stderr
    assert "fix: export RLKIT_HOME" in done.stderr


def test_rlkit_home_with_a_tilde_is_the_users_home(tmp_path: Path) -> None:
    _trial(tmp_path / "home", tmp_path / "trial", "a\n")
    done = run_rlkit("logs", "exp/t1", env={"HOME": str(tmp_path), "RLKIT_HOME": "~/home"})
    assert (done.returncode, done.stdout) == (0, "a\n"), done.stderr


def test_a_relative_fileroot_says_how_to_set_it(tmp_path: Path) -> None:
    done = run_rlkit("render", str(CONFIGS / "grpo-cpu-demo.yaml"),
                     env={"RLKIT_FILEROOT": "", "RLKIT_HOME": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert "cluster.fileroot '' must be an absolute path" in done.stderr
    assert "fix: e.g. cluster.fileroot=/" in done.stderr


def test_an_override_of_bytes_that_are_not_utf8_is_named_as_such(tmp_path: Path) -> None:
    # a Latin-1 terminal's é (byte 0xe9): it was "not valid YAML", with "quote it" for a fix, which cannot help
    done = subprocess.run([sys.executable, "-m", "rlkit", "render", str(CONFIGS / "grpo-cpu-demo.yaml"),
                           b"cluster.fileroot=/tmp/caf\xe9"], capture_output=True, timeout=120, cwd=REPO, check=False,
                          env={**os.environ, "RLKIT_HOME": str(tmp_path), "LC_ALL": "C.UTF-8"})
    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert "error: override 'cluster.fileroot=/tmp/caf\\udce9' holds bytes that are not UTF-8 text" in stderr
    assert "fix: type it in a UTF-8 terminal" in stderr


@pytest.mark.parametrize("command", ["stop", "status"])
def test_a_controller_that_does_not_answer_is_said_not_taken_for_an_ended_job(command: str, tmp_path: Path) -> None:
    # stop said "has already ended; nothing to cancel" (exit 0) of a job it could not ask about, left running
    _trial(tmp_path / "home", tmp_path / "trial", "a\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller "
                                      "(connect failure)' >&2\nexit 1\n")
    (bin_dir / "scontrol").chmod(0o755)
    env = {"RLKIT_HOME": str(tmp_path / "home"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = run_rlkit(command, "exp/t1", env=env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "failed: scontrol show job 7 failed: slurm_load_jobs error: Unable to contact" in done.stderr
    assert "already ended" not in done.stdout + done.stderr
