"""The top-level `auxiliary_models` list: extra models served beside the policy for the job's own code (an LLM judge a
reward function asks, later the tools of agent workflows), each its own group of inference servers in the job.

Names from the seeds: Trinity-RFT's `explorer.auxiliary_models` entries (`model_path`, `tensor_parallel_size`,
`engine_num`); AReaL has no such key. rlkit adds `name` (how user code asks for the model:
`rlkit.rewards.auxiliary.auxiliary_model(name)`), `backend` and `max_model_len`. The engine's other settings (dtype,
seed, memory fraction, extra_args) come from the top-level `vllm` / `sglang` section of that backend: they describe
the site's engine (what its GPUs compute in, its CPU flags), which the policy's servers already had to get right.

A list of sections is not something OmegaConf reports well (an unknown key in an entry loses its position, a mapping
where the list belongs is a TypeError), so `check_entries` reads the raw YAML shape first and drops what it reported.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlkit.config.schema.fields import _f

if TYPE_CHECKING:
    from rlkit.config.problems import Problems

FIELD = "auxiliary_models"
NAME_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")  # a step name, a name-resolve key part, a bash identifier
_REFERENCE = re.compile(r"\$\{.+\}")


@dataclass
class AuxiliaryModelConfig:
    """One auxiliary model: `engine_num` servers of `tensor_parallel_size` GPUs each, on nodes of their own."""

    name: str = _f("", "Identifier user code asks for (auxiliary_model('judge')): letters, digits and _, starting "
                       "with a letter, unique in the list; names the job's steps aux-<name>-<i>.")
    model_path: str = _f("", "Hugging Face model directory or hub id (fetched at submit like actor.path).")
    engine_num: int = _f(1, "Number of servers of this model.", ge=1)
    tensor_parallel_size: int = _f(1, "GPUs per server (they must fit on one node).", ge=1)
    backend: str = _f("vllm", "Inference engine: vllm or sglang; its other settings (dtype, seed, memory fraction, "
                              "extra_args) come from the top-level section of that name.")
    max_model_len: int | None = _f(None, "Context length (prompt + completion) of these servers; None: the "
                                         "model's own (the backend section's limit is the policy's).", ge=1)


def entry_field(index: int, name: str) -> str:
    """The dotted path of one entry's field, as messages name it and rlkit.config.schema.experiment.get_field
    reads it."""
    return f"{FIELD}[{index}].{name}"


def model_path_fields(config: object) -> list[str]:
    """The dotted paths of every entry's model_path in a config (hub ids fetched, binds derived, relative paths
    anchored)."""
    return [entry_field(i, "model_path") for i in range(len(getattr(config, FIELD, ())))]


def _field_types() -> dict[str, tuple[type, ...]]:
    """Each entry field's accepted YAML types (None for an optional one)."""
    hints = typing.get_type_hints(AuxiliaryModelConfig)
    out: dict[str, tuple[type, ...]] = {}
    for f in dataclasses.fields(AuxiliaryModelConfig):
        args = typing.get_args(hints[f.name]) or (hints[f.name],)
        out[f.name] = tuple(type(None) if a is type(None) else a for a in args)
    return out


def check_entries(data: dict[str, Any], origin: str, problems: Problems) -> None:
    """The raw `auxiliary_models` value of a YAML mapping (or the overrides): a list of mappings with known keys of
    the right types. Each problem goes to `problems` and the offending key (or the whole value) is dropped from
    `data`, so the schema merge reports everything else."""
    if FIELD not in data or data[FIELD] is None:
        data.pop(FIELD, None)
        return
    value = data[FIELD]
    if isinstance(value, str) and _REFERENCE.fullmatch(value.strip()):
        return  # `${...}`: whatever it names, read by the merge
    if not isinstance(value, list):
        problems.add(f"{FIELD} ({origin}) must be a list of models, not a {type(value).__name__}",
                     hint=f"write it as a YAML list: {FIELD}: [{{name: judge, model_path: /models/judge}}] (on the "
                          "command line too: the whole list is one override)")
        del data[FIELD]
        return
    types = _field_types()
    kept = []
    for index, entry in enumerate(value):
        if not isinstance(entry, dict):
            problems.add(f"{FIELD}[{index}] ({origin}) must be a mapping of name, model_path, ..., not "
                         f"{type(entry).__name__} {entry!r}", hint="e.g. {name: judge, model_path: /models/judge}")
            continue
        entry = dict(entry)
        for key in list(entry):
            if key not in types:
                close = difflib.get_close_matches(str(key), list(types), n=1, cutoff=0.6)
                problems.add(f"unknown key '{FIELD}[{index}].{key}' ({origin})",
                             hint=f"did you mean '{close[0]}'?" if close else f"valid keys here: {', '.join(types)}")
                del entry[key]
                continue
            item = entry[key]
            ok = (isinstance(item, str) and _REFERENCE.fullmatch(item.strip())) or (
                isinstance(item, types[key]) and not (isinstance(item, bool) and bool not in types[key]))
            if not ok:
                wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types[key])
                problems.add(f"wrong type for '{FIELD}[{index}].{key}' ({origin}): {item!r} is not {wanted}")
                del entry[key]
        kept.append(entry)
    data[FIELD] = kept
