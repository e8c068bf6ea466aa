"""The CLI zygote (tests/helpers/cli_zygote.py) that run_rlkit forks `python -m rlkit` from: a forked call prints,
exits and fails exactly as a fresh interpreter does (argv, environment, working directory, stdout and stderr apart,
exit codes 0, 2 and 1 with the traceback), a call past its timeout is killed, and a call whose interpreter settings
differ runs as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import cli_zygote
from tests.helpers.cli_zygote import run_cli
from tests.helpers.zygote import ForkedProcess, Zygote

PROBE = r'''
import atexit, os, sys, time
print("argv", sys.argv[1:], "prog", os.path.basename(sys.argv[0]), "cwd", os.getcwd(), "mine",
      os.environ.get("ONLY_MINE"), "main", __name__, "path0", sys.path[0] == os.getcwd())
print("to stderr", file=sys.stderr)
atexit.register(lambda: print("atexit ran"))
os.environ["LEAKED"] = "1"
if sys.argv[1] == "sleep":
    time.sleep(600)
if sys.argv[1] == "crash":
    raise ValueError("boom")
raise SystemExit(int(sys.argv[1]))
'''


@pytest.fixture(scope="module")
def probe_zygote() -> Zygote:
    """A zygote of its own (nothing preloaded): run_rlkit's is the session's."""
    return Zygote("probe", (), dict(os.environ))


@pytest.mark.parametrize("args", [["0"], ["2"], ["crash"]])
def test_a_forked_module_runs_as_python_dash_m(args: list[str], probe_zygote: Zygote, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "probe_cli.py").write_text(PROBE)
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "ONLY_MINE": "a b"}
    fresh = subprocess.run([sys.executable, "-m", "probe_cli", *args], capture_output=True, text=True, env=env,
                           timeout=60, check=False)
    forked = ForkedProcess(probe_zygote, {"module": "probe_cli", "args": args, "env": env, "cwd": str(tmp_path)},
                           split_stderr=True)
    stdout, stderr = forked.communicate(timeout=60)
    assert stderr is not None
    assert (forked.returncode, stdout, stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert f"argv {args} prog probe_cli.py cwd {tmp_path} mine a b main __main__ path0 True" in stdout
    assert "atexit ran" in stdout and stderr.startswith("to stderr")
    assert forked.returncode == {"0": 0, "2": 2, "crash": 1}[args[0]]
    if args == ["crash"]:
        assert 'probe_cli.py", line 11, in <module>' in stderr and "ValueError: boom" in stderr
    leaked = ForkedProcess(probe_zygote, {"source": "import os; print(os.environ.get('LEAKED'))", "args": [],
                                          "env": dict(os.environ), "cwd": str(tmp_path)}, split_stderr=True)
    assert leaked.communicate(timeout=60) == ("None\n", "")  # nothing of an earlier child stays behind


def test_the_cli_forked_prints_and_exits_as_a_fresh_one() -> None:
    env = dict(os.environ)
    for args in (["--help"], ["statsu"]):  # typer's usage and program name, a usage mistake's exit 2
        forked, fresh = run_cli(args, env, 60), run_cli(args, env, 60, fresh=True)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    loaded = ForkedProcess(cli_zygote.ZYGOTE_PROCESS, {"source": "import sys; print(*(m in sys.modules for m in "
                                                                "('rlkit.cli.main', 'torch')))", "args": [],
                                                      "env": env, "cwd": os.getcwd()}, split_stderr=True)
    assert loaded.communicate(timeout=60) == ("True False\n", "")  # the CLI preloaded, torch not (it stays torch-free)


def test_a_call_past_its_timeout_is_killed(probe_zygote: Zygote, tmp_path: Path) -> None:
    (tmp_path / "probe_cli.py").write_text(PROBE)
    forked = ForkedProcess(probe_zygote, {"module": "probe_cli", "args": ["sleep"], "env": dict(os.environ),
                                          "cwd": str(tmp_path)}, split_stderr=True)
    with pytest.raises(subprocess.TimeoutExpired):
        forked.communicate(timeout=2)
    forked.kill()
    forked.communicate(timeout=60)
    assert forked.returncode == -9
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli(["--help"], dict(os.environ), 0.001)


def test_a_call_with_other_interpreter_settings_is_not_forked() -> None:
    env = dict(cli_zygote.ZYGOTE_PROCESS.env)
    assert cli_zygote.forkable({**env, "RLKIT_HOME": "/elsewhere"})
    for changed in ({"PYTHONPATH": "/user/code"}, {"PYTHONWARNINGS": "error"}, {"COLUMNS": "40"}, {"LC_ALL": "C"}):
        assert not cli_zygote.forkable({**env, **changed}), changed
    result = run_cli(["--help"], {**env, "PYTHONPATH": f"{env.get('PYTHONPATH', '')}:/nonexistent"}, 60)
    assert isinstance(result.args, list) and result.returncode == 0 and "Usage" in result.stdout
