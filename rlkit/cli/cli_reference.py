"""The CLI reference page, made by Typer itself (typer.cli's `utils docs` generator, the one `typer rlkit.cli.main
utils docs` runs) from the `rlkit` app, so that every command, argument and option is documented as `--help` says
it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
import typer.cli

if TYPE_CHECKING:
    from typer._click import Command

CLI_PAGE = "reference/cli.md"  # under docs/
TITLE = "CLI reference"
INTRO = ("Every `rlkit` command with its arguments and options, generated from the command's own `--help` texts by "
         "`rlkit docs generate` (Typer's docs generator). `serve`, `train` and `client` are the steps a job runs; "
         "you never call them yourself.")


def render_cli(command: Command) -> str:
    """The markdown of the CLI reference page of `command`, the whole `rlkit` app (typer.main.get_command(app))."""
    ctx = typer.Context(command, info_name="rlkit")
    body = typer.cli.get_docs_for_click(obj=command, ctx=ctx, name="rlkit", title=TITLE)
    head, _, rest = body.strip().partition("\n")
    return f"{head}\n\n{INTRO}\n{rest}\n"
