"""AReaL's per-engine layout fields, `rollout.backend: "sglang:d4p1t1"` and `actor.backend: "fsdp:d4p1t1"`: AReaL's
current way to give what `allocation_mode` gives. rlkit reads them through the one parser
(rlkit.config.allocation.parse_allocation): without allocation_mode they become it; with it, both must name the
same layout (compared in canonical form). `ref.backend` and `critic.backend` must be the actor's: rlkit runs the
reference and the critic on the trainer's GPUs.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlkit.config.allocation import canonical_mode, parse_allocation
from rlkit.config.areal_accept import FoundKey
from rlkit.config.problems import Problems
from rlkit.errors import ConfigError, each_error

SERVER_KEY = "rollout.backend"
TRAINER_KEY = "actor.backend"
ON_TRAINER_GPUS = ("ref.backend", "critic.backend")


def _values(found: list[FoundKey], raw: dict[str, Any], problems: Problems) -> dict[str, str]:
    """The layout keys' values, `${...}` resolved against the user's own mapping (the layout is needed before the
    schema merge); an unresolvable or non-string one goes to `problems`."""
    wanted = {item.key: item for item in found if item.key in (SERVER_KEY, TRAINER_KEY, *ON_TRAINER_GPUS)}
    if not wanted:
        return {}
    values: dict[str, str] = {}
    for key, item in wanted.items():
        value = item.value
        try:
            if isinstance(value, str) and "${" in value:
                tree = OmegaConf.create(raw)
                OmegaConf.update(tree, key, value, force_add=True)
                value = OmegaConf.select(tree, key, throw_on_resolution_failure=True)
        except (OmegaConfBaseException, ValueError, TypeError) as exc:
            problems.add(f"cannot resolve '{key}' ({item.origin}): {str(exc).splitlines()[0]}")
            continue
        if not isinstance(value, str) or not value.strip():
            problems.add(f"'{key}' must be a layout string such as \"sglang:d4\" or \"fsdp:d4\" (got {value!r}) "
                         f"({item.origin})")
            continue
        values[key] = value
    return values


def apply_layout(found: list[FoundKey], data: dict[str, Any], overrides: dict[str, Any],
                 raw: dict[str, Any], problems: Problems) -> None:
    """Check the per-engine layout fields among `found` and, when allocation_mode is given nowhere (`data`,
    `overrides`), set it in `data` from them. `raw`: the user's whole mapping, for `${...}` in the fields."""
    values = _values(found, raw, problems)
    trainer = values.get(TRAINER_KEY)
    for key in ON_TRAINER_GPUS:
        if key in values and trainer is not None and values[key] != trainer:
            problems.add(f"'{key}' is '{values[key]}' but actor.backend is '{trainer}'",
                         hint=f"remove {key}: rlkit runs it on the trainer's GPUs (actor.backend)")
    parts = [(k, values[k]) for k in (SERVER_KEY, TRAINER_KEY) if k in values]
    if not parts:
        return
    named = " and ".join(f"{k} '{v}'" for k, v in parts)
    mode = "+".join(v for _, v in parts)
    try:
        ours = canonical_mode(parse_allocation(mode))
    except ConfigError as exc:
        for error in each_error(exc):
            problems.add(f"{named}: {error.message.split(': ', 1)[-1]}", hint=error.hint)
        return
    given = overrides.get("allocation_mode", data.get("allocation_mode"))
    if given is None:
        data["allocation_mode"] = mode
        return
    try:
        theirs = canonical_mode(parse_allocation(str(given)))
    except ConfigError:
        return  # the allocation_mode check reports it
    if theirs != ours:
        problems.add(f"allocation_mode '{given}' ({theirs}) and {named} ({ours}) give different layouts",
                     hint="keep one of the two ways (AReaL's current one is the per-engine backend fields)")
