"""The consoles every `rlkit` command prints through (rich), sized once here."""

from __future__ import annotations

import sys

from rich.console import Console

PIPED_WIDTH = 1000  # a table sized to its content, never cut at rich's 80-column default for non-terminals


def console(stderr: bool = False) -> Console:
    """A console of the terminal's width; piped or redirected output gets the full lines (tables not truncated)."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, soft_wrap=True, width=None if stream.isatty() else PIPED_WIDTH, highlight=False)
