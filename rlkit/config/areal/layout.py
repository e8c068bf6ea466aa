"""AReaL's per-engine layout fields, `rollout.backend: "sglang:d4p1t1"` and `actor.backend: "fsdp:d4p1t1"`: AReaL's
current way to give what `allocation_mode` gives. rlkit reads them through the one parser
(rlkit.config.allocation.parse_allocation): without allocation_mode they become it; with it, both must name the
same layout (compared in canonical form). `ref.backend` and `critic.backend` must be the actor's: rlkit runs the
reference and the critic on the trainer's GPUs.
"""

from __future__ import annotations

import re
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlkit.config.allocation import canonical_mode, parse_allocation
from rlkit.config.areal.accept import FoundKey
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


_BARE_ENGINE = re.compile(r"[a-z]+")  # `actor.backend: fsdp`: AReaL's older meaning, the engine only


def _check_engines(engines: dict[str, str], allocation_mode: Any, problems: Problems) -> None:
    """Per-engine fields that name an engine without a layout (`actor.backend: fsdp`, AReaL until late 2025, with the
    layout in allocation_mode): each must be the engine allocation_mode gives that part (the trainer's for
    actor/ref/critic, the servers' for rollout)."""
    if not engines:
        return
    if not isinstance(allocation_mode, str):
        named = ", ".join(f"{k} '{v}'" for k, v in engines.items())
        problems.add(f"{named} name(s) an engine but no layout, and allocation_mode is not set",
                     hint="set allocation_mode (e.g. vllm:d2+fsdp:d2), or write the fields as backend:dims")
        return
    try:
        allocation = parse_allocation(allocation_mode)
    except ConfigError:
        return  # the allocation_mode check reports it
    for key, engine in engines.items():
        part = allocation.server if key == SERVER_KEY else allocation.trainer
        ours = part.backend if part is not None else None
        if engine.strip() != ours:
            problems.add(f"'{key}: {engine}' but allocation_mode '{allocation_mode}' gives "
                         f"{'the servers' if key == SERVER_KEY else 'the trainer'} {ours or 'no engine'}",
                         hint=f"set {key} to {ours} or remove it" if ours else f"remove {key}")


def apply_layout(found: list[FoundKey], data: dict[str, Any], overrides: dict[str, Any],
                 raw: dict[str, Any], problems: Problems) -> None:
    """Check the per-engine layout fields among `found` and, when allocation_mode is given nowhere (`data`,
    `overrides`), set it in `data` from them. `raw`: the user's whole mapping, for `${...}` in the fields."""
    values = _values(found, raw, problems)
    engines = {key: values.pop(key) for key in list(values) if _BARE_ENGINE.fullmatch(values[key].strip())}
    _check_engines(engines, overrides.get("allocation_mode", data.get("allocation_mode")), problems)
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
