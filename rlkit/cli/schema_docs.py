"""The schema as documentation: every field and section of rlkit's config with its help text, type, default, range,
AReaL name and the job types that read it. One source for the configuration reference pages
(rlkit.cli.config_reference) and `rlkit explain` (rlkit.cli.explain). Torch-free: it reads the dataclasses and the
job types' records, nothing that trains."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any

from omegaconf import MISSING

from rlkit.config.areal.keys import TABLES
from rlkit.config.areal.names import AREAL_KEYS
from rlkit.config.areal.rules import Rule
from rlkit.config.schema.auxiliary import FIELD as AUXILIARY
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.schema.fields import Range
from rlkit.jobs.registry import registered_job_types

LIST_ITEM = "[]"  # `auxiliary_models[].name`: a field of every entry of a list of sections
# rlkit sections whose AReaL counterpart has the same keys under another section path (AReaL reuses one class)
AREAL_SAME_KEYS = {"critic.mb_spec": "actor.mb_spec", "critic.optimizer": "actor.optimizer",
                   "actor.adv_norm": "actor.reward_norm", "eval_gconfig": "gconfig"}
# AReaL keys whose value rlkit reads under another name but that no `renamed` rule moves (a same_value rule)
AREAL_OTHER_NAMES = {"evaluator.eval_on_startup": "evaluator.eval_before_train"}
NOT_IN_AREAL = "not in AReaL"


@dataclass(frozen=True)
class FieldDoc:
    """One field or section of the schema as the docs show it. `section`: a nested section (its fields are
    documented one by one); `areal`: AReaL's name when it differs, "" when the same, NOT_IN_AREAL when AReaL has
    none; `job_types`: who reads it ("" where no job type claims it: the launcher's and every job's fields)."""

    path: str
    help: str
    type: str
    default: str
    range: str
    section: bool
    areal: str
    job_types: tuple[str, ...]
    doc: str = ""  # a section's docstring (what its class says), "" for a leaf


def _type_name(hint: Any) -> str:
    """A type hint in a YAML user's words: integer, number, string, boolean, list of strings, mapping, or null."""
    if hint is type(None):
        return "null"
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return " or ".join(_type_name(arg) for arg in typing.get_args(hint))
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        return "list of sections" if dataclasses.is_dataclass(item) else f"list of {_type_name(item)}s"
    if origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(hint):
        return "section"
    return {int: "integer", float: "number", str: "string", bool: "boolean"}.get(hint, getattr(hint, "__name__",
                                                                                               str(hint)))


def _yaml(value: Any) -> str:
    """A default as it is written in YAML."""
    if value is None:
        return "null"
    if value == MISSING:
        return "required"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if value == "" or value.strip() != value else value
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _range(bounds: Range | None) -> str:
    """`>= 1`, `> 0 and <= 1`: the bounds rlkit.config.ranges enforces."""
    if bounds is None:
        return ""
    parts = [f"{op} {int(value) if float(value).is_integer() else format(value, 'g')}"  # 2**32-1 in full
             for op, value in ((">=", bounds.ge), (">", bounds.gt), ("<=", bounds.le), ("<", bounds.lt))
             if value is not None]
    return " and ".join(parts)


def _renamed_to() -> dict[str, str]:
    """{rlkit path: AReaL path} of every AReaL key that rlkit reads under another name (the `renamed` rules)."""
    found: dict[str, str] = {}

    def walk(prefix: str, table: dict[str, Rule]) -> None:
        for key, rule in table.items():
            areal = f"{prefix}.{key}" if prefix else key
            if rule.renamed_to:
                found.setdefault(rule.renamed_to, areal)
            walk(areal, rule.keys)

    for section, table in TABLES.items():
        walk(section, table)
    return {**found, **AREAL_OTHER_NAMES}


def areal_name(path: str) -> str:
    """AReaL's name of an rlkit field: "" when it is the same, another dotted name, or NOT_IN_AREAL."""
    section, _, key = path.rpartition(".")
    keys = AREAL_KEYS.get(AREAL_SAME_KEYS.get(section, section), "").split()
    if key in keys:
        return ""
    return _renamed_to().get(path, NOT_IN_AREAL)


def job_types_of(path: str) -> tuple[str, ...]:
    """The job types that read a field, from their records (rlkit.jobs: `JobType.sections` and their flags); () for
    the fields no job type claims: the launcher's, the cluster's and the top-level ones every job is described by."""
    top = path.split(".")[0].removesuffix(LIST_ITEM)
    if top == "ref":
        return tuple(j.name for j in registered_job_types() if j.kl_terms or j.always_reference)
    if top in ("vllm", "sglang"):
        return tuple(j.name for j in registered_job_types() if j.needs_servers)
    if top == AUXILIARY:
        return tuple(j.name for j in registered_job_types() if j.auxiliary)
    return tuple(j.name for j in registered_job_types() if top in j.sections)


def _section_of(hint: Any) -> type | None:
    """The dataclass of a nested (or optional) section, or of each entry of a list of sections."""
    args = typing.get_args(hint) or (hint,)
    if typing.get_origin(hint) is list:
        return _section_of(args[0])
    return next((a for a in args if isinstance(a, type) and dataclasses.is_dataclass(a)), None)


def _walk(cls: type, instance: Any, prefix: str, out: list[FieldDoc]) -> None:
    """Document `cls`'s fields; defaults are read from `instance`, the section as its parent builds it (the critic's
    optimizer has its own learning rate), or from the class where the section is a list entry or optional."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        nested = _section_of(hints[f.name])
        default = getattr(instance, f.name)
        out.append(FieldDoc(
            path=path, help=str(f.metadata.get("help", "")), type=_type_name(hints[f.name]),
            default="" if dataclasses.is_dataclass(default) else _yaml(default),
            range=_range(f.metadata.get("range")), section=nested is not None, areal=areal_name(path),
            job_types=job_types_of(path), doc=_doc(nested) if nested is not None else ""))
        if nested is not None:
            entry = typing.get_origin(hints[f.name]) is list
            _walk(nested, default if dataclasses.is_dataclass(default) else nested(),
                  f"{path}{LIST_ITEM}." if entry else f"{path}.", out)


def _doc(cls: type) -> str:
    """A section class's docstring, joined into one paragraph per blank-line break."""
    text = (cls.__doc__ or "").strip()
    return "\n\n".join(" ".join(line.strip() for line in part.splitlines()) for part in text.split("\n\n"))


@cache
def schema_docs() -> dict[str, FieldDoc]:
    """{dotted path: FieldDoc} of every field and section, in the schema's order."""
    out: list[FieldDoc] = []
    _walk(ExperimentConfig, ExperimentConfig(), "", out)
    return {doc.path: doc for doc in out}


def parent(path: str) -> str:
    """The section a field is in (`""`: the top level); an entry's field is in its list's section."""
    return path.rpartition(".")[0].removesuffix(LIST_ITEM)


def children(path: str) -> list[FieldDoc]:
    """The direct fields of a section (`""`: the top level)."""
    return [doc for p, doc in schema_docs().items() if parent(p) == path]
