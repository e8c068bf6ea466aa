"""Field helpers shared by the schema modules: every field carries a one-line help text."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def _f(default: Any, help: str) -> Any:
    """A field with a default and a one-line help text."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _sub(cls: type, help: str) -> Any:
    """A nested section."""
    return field(default_factory=cls, metadata={"help": help})
