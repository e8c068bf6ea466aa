"""A zygote for the tests' `rlkit` CLI calls (tests/conftest.py's run_rlkit): one process imports typer, rich,
pydantic and rlkit's CLI modules once, then forks one child per call (the fork server: tests/helpers/zygote.py). A
fresh `python -m rlkit` spends ~0.6-0.9 CPU-s on those imports before its often tiny work, and the suite makes several
hundred calls.

The child runs `python -m rlkit ARGS` as the interpreter would: argv, environment, working directory, stdout and
stderr in separate pipes, the exit code, atexit handlers. torch is not preloaded: the CLI must stay torch-free, and a
preloaded torch would hide a regression. A call the fork cannot serve faithfully runs as a real subprocess: one whose
environment differs from the zygote's in a variable read at interpreter start or at a preloaded module's import
(PYTHON*, the locale, the terminal and colour settings rich and typer read once), or when the zygote does not start.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.zygote import ForkedProcess, Zygote

# what `rlkit status`, `submit`, `render`, `logs`, `stop`, `explain` and `--help` import (python -X importtime, and
# sys.modules after a refused grpo submit): a refused submit's fork spends 0.46 CPU-s with these, 1.47 with half
PRELOAD = ("rlkit.cli.main", "typer._adapters", "typer._click.decorators", "typer.rich_utils", "rich._emoji_codes",
           "pydantic.plugin._loader", "omegaconf._impl", "omegaconf.vendor.antlr4.LL1Analyzer", "httpx",
           "rlkit.cli.status", "rlkit.cli.explain", "rlkit.launch.stages", "rlkit.rewards", "rlkit.agent.workflows",
           "rlkit.agent.tools", "rlkit.jobs.grpo.checks", "rlkit.checks.lora", "rlkit.checks.evaluation",
           "rlkit.servers.extra_args", "rlkit.servers.cuda_probe", "rlkit.servers.http", "rlkit.servers.vllm.backend",
           "rlkit.servers.vllm.command", "rlkit.servers.vllm.wire", "rlkit.tasks.digits",
           "tests.helpers.cli_warmup")  # last: a first call's one-time work, done before the forks (its docstring)

# read once, at the interpreter's start or a preloaded module's import (rich.console, typer.rich_utils)
START_VARIABLES = frozenset({"LANG", "LC_ALL", "LC_CTYPE", "TERM", "COLORTERM", "COLUMNS", "LINES", "NO_COLOR",
                             "FORCE_COLOR", "PY_COLORS", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "TERMINAL_WIDTH",
                             "GITHUB_ACTIONS", "JUPYTER_COLUMNS", "JUPYTER_LINES"})

ZYGOTE_PROCESS = Zygote("cli", PRELOAD, dict(os.environ))


def run_cli(args: list[str], env: dict[str, str], timeout: float, *,
            fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m rlkit ARGS` with `env`: forked from the zygote unless `fresh` or the fork would differ."""
    argv = [sys.executable, "-m", "rlkit", *args]

    def started() -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)

    if fresh or not forkable(env):
        return started()
    request = {"module": "rlkit", "args": list(args), "env": env, "cwd": os.getcwd()}
    try:
        child = ForkedProcess(ZYGOTE_PROCESS, request, split_stderr=True)
    except RuntimeError:  # the zygote did not start (its log is in the message): a real interpreter still can
        return started()
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        child.kill()
        stdout, stderr = child.communicate()
        raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr) from exc
    assert child.returncode is not None
    return subprocess.CompletedProcess(argv, child.returncode, stdout, stderr or "")


def forkable(env: dict[str, str]) -> bool:
    """Whether `env` agrees with the zygote's in every variable its imports already read."""
    zygote_env = ZYGOTE_PROCESS.env
    watched = {key for key in (*env, *zygote_env) if key.startswith(("PYTHON", "_TYPER_")) or key in START_VARIABLES}
    return all(env.get(key) == zygote_env.get(key) for key in watched)
