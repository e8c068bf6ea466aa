"""`rlkit doctor CONFIG [OVERRIDES]` (rlkit.launch.doctor does the work)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from rlkit.cli.console import TITLE, console, literal
from rlkit.errors import UserError

_out = console()


def doctor(config: Path = typer.Argument(..., help="Experiment YAML file.", show_default=False),
           overrides: list[str] = typer.Argument(None, help="key.path=value overrides.", show_default=False),
           wait_min: int = typer.Option(None, "--wait", help="Minutes to wait for the job, its time in the queue "
                                        "included (default: its own time limit and two hours in the queue); past "
                                        "them it keeps running and the command says how to follow it.",
                                        show_default=False)) -> None:
    """Check the site for this config on the nodes it would get (shared fileroot, GPUs, container, model, an
    all-reduce between all its nodes) in a short job; a table of what passed and each fix. Exit 1 if any failed."""
    from rlkit.launch.doctor import run_doctor, summary_rows
    from rlkit.launch.submit import prepare

    if wait_min is not None and wait_min < 1:
        raise UserError(f"--wait {wait_min}: must be at least 1 (minutes)", hint="e.g. --wait 30")
    prepared = prepare(config, overrides or [], preflight=True)
    run = run_doctor(prepared, say=lambda text: _out.print(text, markup=False), wait_min=wait_min)
    table = Table("check", "nodes", "result", "detail", "fix", title=literal(f"rlkit doctor: job {run.job_id}", TITLE))
    for name, nodes, ok, detail, fix in summary_rows(run.checks):
        table.add_row(literal(name), literal(nodes), "ok" if ok else "[red]FAILED[/red]", literal(detail), literal(fix))
    _out.print(table)
    failed = sorted({c.name for c in run.checks if not c.ok})
    if failed:
        _out.print(f"[red]failed:[/red] {escape(', '.join(failed))}")
        raise typer.Exit(1)
    _out.print("[green]all checks passed[/green]")
