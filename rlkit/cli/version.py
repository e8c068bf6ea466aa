"""`rlkit --version`: the release and the source id (rlkit.source_id), what a bug report and a node check name."""

from __future__ import annotations

import typer

from rlkit.cli.console import write_out


def _print_version(value: bool) -> None:
    if value:
        from rlkit.source_id import describe

        write_out(describe() + "\n")
        raise typer.Exit(0)


def top_options(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                             help="Print rlkit's version and source id (a hash of its files: the "
                                                  "same code, the same id) and exit.")) -> None:
    """The options before a command (typer's app callback); --version acts while they are read."""
