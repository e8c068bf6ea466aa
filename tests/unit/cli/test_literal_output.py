"""Text users and jobs write is printed as written: a trial name, a config value, a path, a progress.json or a
manifest holding rich markup (`[/x]` once raised rich's MarkupError as a traceback, `[red]` restyled the line) or an
emoji code (`a:b:c` showed `:b:` as an emoji) comes out literally, while rlkit's own styling stays."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from rlkit.cli import main
from rlkit.cli.console import console
from rlkit.cli.status import TrialDetail, TrialRow, _row, print_detail, trials_table
from rlkit.launch.slurm import JobInfo
from rlkit.trials.records import TrialRecord
from tests.conftest import run_rlkit

HOSTILE = "[/x] [red]x[/red] a:b:c"


@pytest.mark.parametrize("args", [("status", "[/x]"), ("explain", HOSTILE)])
def test_an_error_naming_markup_exits_2_with_it_literally(args: tuple[str, ...], tmp_path: Path) -> None:
    result = run_rlkit(*args, env={"RLKIT_HOME": str(tmp_path / "home")})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("error: ") and f"'{args[1]}'" in result.stderr, result.stderr
    assert "fix: " in result.stderr, result.stderr


def test_a_warning_prints_markup_and_emoji_codes_literally(capsys: pytest.CaptureFixture[str]) -> None:
    main.warn(f"actor.path: '/tmp/{HOSTILE}' is not a model directory")
    assert capsys.readouterr().err == f"warning: actor.path: '/tmp/{HOSTILE}' is not a model directory\n"


def _buffered(terminal: bool = False) -> Console:
    """rlkit's own console (no emoji codes) into a buffer; `terminal`: as a colour terminal shows it (styles kept)."""
    if terminal:
        return Console(file=StringIO(), force_terminal=True, color_system="standard", emoji=False, width=200,
                       highlight=False)
    shown = console()
    shown.file = StringIO()
    return shown


def _printed(table: Table, terminal: bool = False) -> str:
    shown = _buffered(terminal)
    shown.print(table)
    return shown.file.getvalue()  # type: ignore[attr-defined]


def test_a_progress_json_step_with_markup_shows_literally_in_the_trials_table(tmp_path: Path) -> None:
    (tmp_path / "progress.json").write_text(json.dumps({"step": "[/x]", "total_steps": 4}))  # not a count: '?'
    record = TrialRecord("exp", "a:b:c", str(tmp_path), "42", 0.0)
    row = _row(record, JobInfo("42", "RUNNING", elapsed="0:05", nodes="n[/x]"))  # as Slurm's answer gave it
    text = _printed(trials_table([row]))
    assert "?/4" in text and "exp/a:b:c" in text and "n[/x]" in text, text
    assert "\x1b[32mRUNNING" in _printed(trials_table([row]), terminal=True)  # the state still green


def test_a_trials_detail_prints_manifest_and_slurm_values_literally() -> None:
    row = TrialRow("e/[red]t[/red]", "7", "FAILED", "1:00", "[/x]", "2026-01-01 00:00", "/tmp/[/x]", "[/x]/4", "")
    detail = TrialDetail(row=row, reason="[/x]", exit_code="1:0", components=[("0", "FAILED", "[/x]")],
                         attempts=["6", "[/x]"], cluster="[/x] a:b:c", failed_step="[/x]",
                         failed_step_tail=["[red]boom[/red]"])
    shown = _buffered()
    print_detail(shown, detail)
    text = shown.file.getvalue()  # type: ignore[attr-defined]
    for expected in ("e/[red]t[/red]  job 7  FAILED  reason [/x]  exit 1:0", "training step [/x]/4",
                     "trial directory: /tmp/[/x]  cluster [/x] a:b:c", "jobs 6, [/x]", "component 0: FAILED on [/x]",
                     "step [/x] failed; its last log lines:", "  [red]boom[/red]"):
        assert expected in text, (expected, text)
    styled = _buffered(terminal=True)
    print_detail(styled, detail)
    assert "\x1b[1me/[red]t[/red]" in styled.file.getvalue()  # type: ignore[attr-defined]  # the name still bold
