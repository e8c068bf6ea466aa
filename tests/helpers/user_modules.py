"""A user's Python module (reward functions, workflows) written into a test's directory and importable by name, as
a user's own file on the job's PYTHONPATH would be; forgotten again when the test ends."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


def importable_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> Iterator[str]:
    """Write `source` as module `name` into `tmp_path`, put it on sys.path; yield the name (a fixture's body)."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
