"""A config mapping with changes given by dotted keys, as the migration tests write Trinity-RFT files."""

from __future__ import annotations

from typing import Any


def with_changes(data: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`data` with each {"section.key": value} of `changes` set (None removes the key), in place; returns it."""
    for key, value in changes.items():
        *parents, last = key.split(".")
        tree = data
        for part in parents:
            tree = tree.setdefault(part, {})
        if value is None:
            tree.pop(last, None)
        else:
            tree[last] = value
    return data
