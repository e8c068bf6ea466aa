"""Walking the schema's dataclasses: its dotted field paths and which fields are sections."""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

from rlkit.config.schema.experiment import ExperimentConfig


def schema_paths(cls: type = ExperimentConfig, prefix: str = "") -> list[str]:
    """Every dotted field path of the schema, sections included."""
    paths: list[str] = []
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        paths.append(path)
        section = section_type(cls, f.name)
        if section is not None:
            paths.extend(schema_paths(section, prefix=f"{path}."))
    return paths


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """`typing.get_type_hints` of a schema class, evaluated once: the schema's annotations are strings (postponed
    evaluation) and each call compiled every one of them again, ~40% of a config load."""
    return typing.get_type_hints(cls)


@functools.cache
def section_type(cls: type, name: str) -> type | None:
    """The dataclass type of a nested section field, or None for a leaf (the schema is fixed: asked once per field)."""
    default = next(f for f in dataclasses.fields(cls) if f.name == name).default_factory
    if default is dataclasses.MISSING:  # an optional section (`NormConfig | None = None`) is one too
        hint = type_hints(cls)[name]
        return next((a for a in typing.get_args(hint) if isinstance(a, type) and dataclasses.is_dataclass(a)), None)
    value = default()
    return type(value) if dataclasses.is_dataclass(value) else None


def field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@functools.cache
def container_kind(cls: type, name: str) -> str | None:
    """"mapping" or "list" for a leaf field typed as a dict or a list (Optional too), else None; None too for a
    list of sections (auxiliary_models, stages), which its own entries check names in its own words."""
    hint = type_hints(cls)[name]
    for candidate in (hint, *typing.get_args(hint)):
        origin = typing.get_origin(candidate) or candidate
        if origin is dict:
            return "mapping"
        if origin is list:
            items = typing.get_args(candidate)
            return None if items and dataclasses.is_dataclass(items[0]) else "list"
    return None
