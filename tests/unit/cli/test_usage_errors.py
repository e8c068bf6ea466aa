"""Usage mistakes at the installed `rlkit` command (the console script pip wrote, as a user runs it): an unknown or
mistyped command, an unknown option, a missing argument, a bad value. Each exits 2 with one error line in click's
words ("did you mean" included) and where the usage is, never a traceback, whatever typer version is installed
(typer 0.29 raises its own vendored copy of click's errors, which rlkit once let through as a traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RLKIT = Path(sys.executable).with_name("rlkit")  # the entry point beside this venv's python


def _rlkit(*args: str) -> subprocess.CompletedProcess[str]:
    assert RLKIT.is_file(), f"{RLKIT}: the installed rlkit command is missing (pip install -e . writes it)"
    return subprocess.run([str(RLKIT), *args], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "COLUMNS": "200"})


@pytest.mark.parametrize(("args", "says"), [
    (("statsu",), ["no such command 'statsu'", "did you mean 'status'?", "fix: `rlkit --help` shows the usage"]),
    (("frobnicate",), ["no such command 'frobnicate'", "fix: `rlkit --help`"]),
    (("submit", "--bogus", "x.yaml"), ["no such option: --bogus", "fix: `rlkit submit --help`"]),
    (("submit", "--forc", "x.yaml"), ["no such option: --forc", "--force",
                                      "fix: `rlkit submit --help`"]),
    (("resume",), ["missing argument 'trial'", "fix: `rlkit resume --help`"]),
    (("status", "a", "b", "c"), ["unexpected extra argument", "fix: `rlkit status --help`"]),
    (("logs", "t", "--lines", "many"), ["invalid value for '--lines'", "fix: `rlkit logs --help`"]),
    (("image", "biuld", "trainer"), ["no such command 'biuld'", "did you mean 'build'?",
                                     "fix: `rlkit image --help`"]),
])
def test_a_usage_mistake_exits_2_with_one_message_and_the_fix(args: tuple[str, ...], says: list[str]) -> None:
    result = _rlkit(*args)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr
    text = " ".join(result.stderr.split()).lower()  # click's words; typer's vendored copy writes 'trial', click 'TRIAL'
    assert text.startswith("error: "), result.stderr
    for phrase in says:
        assert phrase in text, (phrase, result.stderr)
    assert result.stdout == ""


def test_rlkit_alone_prints_its_commands_without_a_traceback() -> None:
    result = _rlkit()
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.returncode in (0, 2)  # click 8.1 exits 0 here, typer's vendored click 2, both print the help
    assert "submit" in result.stdout + result.stderr and "status" in result.stdout + result.stderr



def test_each_command_s_summary_reflows_to_the_terminal() -> None:
    """The commands' summaries come from docstrings written at 120 columns: the help reflows them to the terminal's
    width (at 400 columns each is one line), not at its source's line breaks (typer's default markup kept those:
    ragged lines at 80 columns)."""
    import typer.main

    from rlkit.cli.main import app

    result = subprocess.run([str(RLKIT), "--help"], capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, "COLUMNS": "400"})
    assert result.returncode == 0, result.stderr
    lines = [" ".join(line.strip(" │").split()) for line in result.stdout.splitlines()]
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name, command in commands.items():
        if command.hidden:
            continue  # the in-job steps
        summary = " ".join((command.help or "").split("\n\n")[0].split()).replace("`", "")
        assert any(line.startswith(name) and summary in line for line in lines), (name, summary)


def test_the_version_names_the_release_and_the_code() -> None:
    """`rlkit --version` for a bug report: the release and the source id (rlkit.source_id), where it runs from."""
    from rlkit import __version__
    from rlkit.source_id import PACKAGE, source_id

    result = _rlkit("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"rlkit {__version__} (source {source_id()}, {PACKAGE})\n"
