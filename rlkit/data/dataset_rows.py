"""The first row of a dataset, read on the login node: enough to check that the columns a job reads exist."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlkit.errors import ConfigError


def first_jsonl_row(field: str, path: Path) -> dict[str, Any] | None:
    """The first row of a .jsonl file or of the first .jsonl file of a directory (None for other formats: those are
    checked in the job); ConfigError naming `field` for an unreadable, empty or non-JSON file."""
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files or files[0].suffix != ".jsonl":
        return None
    try:
        with open(files[0]) as f:
            line = next((line for line in f if line.strip()), None)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{field}: {files[0]} cannot be read as text: "
                          f"{getattr(exc, 'strerror', None) or exc}", hint="give a .jsonl file you may read",
                          site=True) from None
    if line is None:
        raise ConfigError(f"{field}: {files[0]} is empty", hint="give a file with at least one row")
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{field}: the first line of {files[0]} is not JSON ({exc})",
                          hint="write one JSON object per line") from None
    return row if isinstance(row, dict) else None
