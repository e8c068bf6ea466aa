"""Small helpers the migrations share (rlkit migrate of verl and Trinity-RFT files): writing a dotted key into a
nested mapping, and telling a real number from a hostile value."""

from __future__ import annotations

import math
from typing import Any


def put(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set `tree`'s value at the dotted `key` ("actor.optimizer.lr"), making the sections on the way."""
    *parents, last = key.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value


def finite_number(value: Any) -> bool:
    """Whether `value` is an int or float (not a bool) and finite: what a numeric knob of another tool's file must be
    before it is compared or converted."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
