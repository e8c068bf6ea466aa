"""One rule for every number of a configuration: the range its schema field declares (`_f(..., ge=1)`, see
rlkit.config.schema.fields), checked centrally before any field-specific check, in the same words for every field
and with a fix that is itself a valid value.

Field-specific checks keep what a range cannot say (a bound that depends on another field, a value that only some
job types accept); they may assume every number is in its range.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Collection, Iterator
from typing import Any

from rlkit.config.problems import Problems
from rlkit.config.schema.fields import Range
from rlkit.config.schema.walk import type_hints


def _number(value: float) -> str:
    """1.0 as 1, 0.5 as 0.5: bounds read as a user writes them."""
    return str(int(value)) if float(value).is_integer() else str(value)


def describe(rng: Range) -> str:
    """The range in words: `positive`, `at least 1`, `between 0 and 1`, `in (0, 1]`."""
    low, low_open = (rng.gt, True) if rng.gt is not None else (rng.ge, False)
    high, high_open = (rng.lt, True) if rng.lt is not None else (rng.le, False)
    if high is None:
        assert low is not None
        if low_open:
            return "positive" if low == 0 else f"greater than {_number(low)}"
        return f"at least {_number(low)}"
    if low is None:
        return f"less than {_number(high)}" if high_open else f"at most {_number(high)}"
    if not low_open and not high_open:
        return f"between {_number(low)} and {_number(high)}"
    return f"in {'(' if low_open else '['}{_number(low)}, {_number(high)}{')' if high_open else ']'}"


def example(rng: Range, default: Any, whole: bool) -> float | None:
    """A value inside the range for the fix line: the field's default when it is one, else the lowest bound's
    nearest valid value; None when neither lies inside (the fix then names the range only)."""
    candidates: list[Any] = [default]
    if rng.ge is not None:
        candidates.append(rng.ge)
    if rng.gt is not None:
        upper = rng.lt if rng.lt is not None else rng.le
        candidates.append(rng.gt + 1 if whole or upper is None else (rng.gt + upper) / 2)
    for value in candidates:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and rng.holds(value):
            return int(value) if whole else value
    return None


class Ranged(typing.NamedTuple):
    path: str
    value: Any
    range: Range
    default: Any
    whole: bool  # an int field
    nullable: bool  # the field takes null


def ranged_fields(node: Any, prefix: str = "") -> Iterator[Ranged]:
    """Every field with a declared range, in sections and lists of sections too."""
    if not dataclasses.is_dataclass(node) or isinstance(node, type):
        return
    hints = type_hints(type(node))
    for f in dataclasses.fields(node):
        path = f"{prefix}.{f.name}" if prefix else f.name
        value = getattr(node, f.name)
        rng = f.metadata.get("range")
        if isinstance(rng, Range):
            kinds = (hints[f.name], *typing.get_args(hints[f.name]))
            yield Ranged(path, value, rng, f.default, int in kinds, type(None) in kinds)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                yield from ranged_fields(item, f"{path}[{i}]")
        else:
            yield from ranged_fields(value, path)


INT_LIMIT = 2**63  # an int field holds what a 64-bit integer holds (Slurm, torch and numpy take no more)


def _holds_numbers(cls: type, name: str) -> bool:
    """A mapping field whose values the schema types as numbers (reward.fns' weights, reasoning_gym.tasks'), not a
    mapping passed on as given (vllm.extra_args, rollout.agent.verifiers.args: their tool judges those)."""
    for hint in (type_hints(cls)[name], *typing.get_args(type_hints(cls)[name])):
        if typing.get_origin(hint) is dict and typing.get_args(hint)[1:] in ((float,), (int,)):
            return True
    return False


def numbers(node: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every number of the config (bools aside), in sections and lists of sections and of numbers too, and in the
    mappings the schema types as {name: number} (as `reward.fns['math']`)."""
    if not dataclasses.is_dataclass(node) or isinstance(node, type):
        return
    for f in dataclasses.fields(node):
        path = f"{prefix}.{f.name}" if prefix else f.name
        value = getattr(node, f.name)
        items: Any = enumerate(value) if isinstance(value, list) else [(None, value)]
        if isinstance(value, dict) and _holds_numbers(type(node), f.name):
            items = ((f"'{key}'", item) for key, item in value.items())
        for i, item in items:
            where = path if i is None else f"{path}[{i}]"
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                yield where, item
            else:
                yield from numbers(item, where)


def check_finite(config: Any, problems: Problems, *, reported: Collection[str] = ()) -> None:
    """Every number is finite (no field means infinity), and every whole one fits in 64 bits: 1e20 samples or an
    infinite learning rate is a typo, which would otherwise fail in the job, after the queue wait. `reported`:
    paths already refused (by their range), not named twice."""
    for path, value in numbers(config):
        if path in reported:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            problems.add(f"{path} must be a finite number (got {value})", hint=f"give {path} a finite value")
        elif isinstance(value, int) and not -INT_LIMIT <= value < INT_LIMIT:
            problems.add(f"{path} is too large (got {value})", hint=f"give {path} a value below 2**63")


def check_ranges(config: Any, problems: Problems) -> None:
    """Every number with a declared range lies in it (None where the field takes null; NaN never), and every number
    is finite (check_finite)."""
    reported: set[str] = set()
    for path, value, rng, default, whole, nullable in ranged_fields(config):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.add(f"{path} must be a number (got {value!r})")
            continue
        if not math.isnan(value) and rng.holds(value):
            continue
        null = " or null" if nullable else ""
        good = example(rng, default, whole)
        hint = f"e.g. {path}={_number(good)}" if good is not None else f"a value {describe(rng)}"
        problems.add(f"{path} must be {describe(rng)}{null} (got {value})",
                     hint=hint + (f", or {path}=null" if nullable else ""))
        reported.add(path)
    check_finite(config, problems, reported=reported)
