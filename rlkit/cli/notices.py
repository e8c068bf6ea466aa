"""What a command says on stderr without failing: warnings, the checks' notes, the one notice of AReaL keys
accepted without use. Printed as written (config values and paths are never read as rich markup), on stderr, since
render's and migrate's stdout is the script or the config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape

from rlkit.cli.console import console

if TYPE_CHECKING:
    from rlkit.config.areal.accept import AcceptedKey

err = console(stderr=True)


def areal_notice(keys: tuple[AcceptedKey, ...]) -> None:
    """The one notice of AReaL keys accepted without use (stderr: render's stdout is the script)."""
    from rlkit.config.areal.accept import notice_lines

    lines = notice_lines(keys)
    if lines:
        err.print(f"[bold cyan]notice:[/bold cyan] {escape(lines[0])}")
        for line in lines[1:]:
            err.print(line, markup=False)


def say_notes(notes: tuple[str, ...], where: str = "") -> None:
    """What the checks said without refusing (rlkit.launch.submit.Prepared.notes), one warning each."""
    for note in notes:
        warn(f"{where}{note}")


def warn(message: str) -> None:
    """One warning on stderr; its text (config values, paths) printed as written, never read as rich markup."""
    err.print(f"[bold yellow]warning:[/bold yellow] {escape(message)}")
