"""The consoles every `rlkit` command prints through (rich), sized once here, and how a value is printed literally.

Values users and jobs write (trial names, paths, config values, progress.json, logs) may hold text rich would read as
markup (`[/x]` raises MarkupError, `[red]` restyles) or as an emoji code (`a:b:c`): rlkit's consoles replace no emoji
codes, and a value goes in as `literal(value)` (a table cell, a title), through rich.markup.escape inside rlkit's own
markup, or in a print with markup=False."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.text import Text

TITLE = "table.title"  # the style rich gives a table title of plain text, for a literal one
PIPED_WIDTH = 1000  # a table sized to its content, never cut at rich's 80-column default for non-terminals


def console(stderr: bool = False) -> Console:
    """A console of the terminal's width; piped or redirected output gets the full lines (tables not truncated)."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, soft_wrap=True, width=None if stream.isatty() else PIPED_WIDTH, highlight=False,
                   emoji=False)


def literal(value: object, style: str = "") -> Text:
    """`value` exactly as written (in `style`), for a table cell or title: no markup in it is read."""
    return Text(str(value), style=style)
