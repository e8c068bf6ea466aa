"""A field of a dataset row named by reward.answer_key: a top-level column, or a dotted path through the row's nested
mappings, so rows as verl's preprocessing writes them (`reward_model: {style: rule, ground_truth: "72"}`) are read
as they are, with `reward.answer_key: reward_model.ground_truth`. The reward that scores a row and the submit-time
checks of a dataset's first rows read it through this one function, so what submit accepts is what the job reads.

Rows come from files others wrote: any value on the path that is not a mapping (a string, a list, null) makes the
field missing, never a TypeError.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()  # what `row_field` returns for a field the row does not hold


def row_field(row: Any, key: str) -> Any:
    """`row[key]` when the row has a column of that exact name, else the value at the end of `key`'s dot-separated
    path through nested mappings (`reward_model.ground_truth`); MISSING when the row or a value on the path is not a
    mapping, or a part is absent. A null value is returned as None (the caller decides what it counts for)."""
    if not isinstance(row, Mapping):
        return MISSING
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return MISSING
        value = value[part]
    return value


def where_missing(row: Any, key: str) -> str:
    """Where the path of `key` breaks in `row` (which lacks it), in words: "reward_model is a str, not an object",
    "reward_model has no 'ground_truth'", "reward_model.ground_truth is null"."""
    if isinstance(row, Mapping) and key in row:
        return f"its column {key} is null"
    parts, value = key.split("."), row
    for i, part in enumerate(parts):
        here = ".".join(parts[:i]) or "the row"
        if not isinstance(value, Mapping):
            return f"{here} is {'null' if value is None else 'a ' + type(value).__name__}, not an object"
        if part not in value:
            return f"{here} has no '{part}'"
        value = value[part]
    return f"{key} is null"
