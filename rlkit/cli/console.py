"""The consoles every `rlkit` command prints through (rich), sized once here, and how a value is printed literally.

Values users and jobs write (trial names, paths, config values, progress.json, logs) may hold text rich would read as
markup (`[/x]` raises MarkupError, `[red]` restyles) or as an emoji code (`a:b:c`): rlkit's consoles replace no emoji
codes, and a value goes in as `literal(value)` (a table cell, a title), through rich.markup.escape inside rlkit's own
markup, or in a print with markup=False."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.text import Text

TITLE = "table.title"  # the style rich gives a table title of plain text, for a literal one
PIPED_WIDTH = 1000  # a table sized to its content, never cut at rich's 80-column default for non-terminals


def console(stderr: bool = False) -> Console:
    """A console of the terminal's width; piped or redirected output gets the full lines (tables not truncated)."""
    stream = sys.stderr if stderr else sys.stdout  # None where the caller closed it (mend_std_streams)
    terminal = stream is not None and stream.isatty()
    return Console(stderr=stderr, soft_wrap=True, width=None if terminal else PIPED_WIDTH, highlight=False,
                   emoji=False)


def mend_std_streams() -> None:
    """A standard stream the caller closed (`rlkit ... >&-`, `2>&-`, `<&-`) becomes /dev/null. Python leaves
    sys.stdout None there: the consoles failed at import, a traceback (exit 1 even for a user mistake, whose exit 2
    scripts test); and the next file rlkit opened would take the free descriptor, read by sbatch as its own."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)  # the lowest free descriptor
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115 (for the process)


def write_out(text: str) -> None:
    """`text` on stdout as UTF-8 whatever the locale's encoding: a rendered script or a migrated config is a file's
    content (the bytes submit writes), a log line the job's own. An ASCII or Latin-1 stdout (LANG=en_US.ISO-8859-1,
    PYTHONIOENCODING=ascii) raised UnicodeEncodeError on a non-ASCII value, a traceback."""
    stream = sys.stdout
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    buffer = getattr(stream, "buffer", None)
    if encoding == "utf8" or buffer is None:
        stream.write(text)
        return
    stream.flush()  # what was written as text first comes first
    buffer.write(text.encode("utf-8", "replace"))
    buffer.flush()


def literal(value: object, style: str = "") -> Text:
    """`value` exactly as written (in `style`), for a table cell or title: no markup in it is read."""
    return Text(str(value), style=style)
