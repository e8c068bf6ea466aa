"""`${...}` references of a Trinity-RFT config, resolved as Trinity-RFT's loader (OmegaConf) resolves them, before
`rlkit migrate` maps its keys: its references name Trinity-RFT's own keys (`${model.model_path}`), which rlkit's
file will not have, so they cannot stay as written. `${oc.env:VAR,default}` reads the environment as it would."""

from __future__ import annotations

from typing import Any, cast

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlkit.config.problems import Problems, interpolation_fix


def _references(value: Any, path: tuple[str | int, ...] = ()) -> list[tuple[tuple[str | int, ...], str]]:
    """(path, text) of every string holding a `${`."""
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _references(item, (*path, key))]
    if isinstance(value, list):
        return [found for index, item in enumerate(value) for found in _references(item, (*path, index))]
    return [(path, value)] if isinstance(value, str) and "${" in value else []


def _dotted(path: tuple[str | int, ...]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path).lstrip(".")


def _typed(value: Any) -> Any:
    """An environment variable's text as the value it spells (`2` -> 2, `true` -> True), as Trinity-RFT's typed
    config turns it into its field's type."""
    if not isinstance(value, str):
        return value
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    return parsed if isinstance(parsed, int | float | bool) else value


def resolve_references(data: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, str]]:
    """`data` with every `${...}` resolved, and {dotted key: the reference text} of each key that held one; a
    ConfigError naming every reference that cannot be resolved (and why) otherwise."""
    found = _references(data)
    if not found:
        return data, {}
    problems = Problems()
    try:
        config = OmegaConf.create(data)
    except OmegaConfBaseException as exc:
        problems.add(f"{source} cannot be read as OmegaConf reads Trinity-RFT files: {str(exc).splitlines()[0]}")
        problems.raise_if_any()
    for path, text in found:
        node: Any = config
        try:
            for part in path:
                node = node[part]  # reading a node resolves its reference
        except OmegaConfBaseException as exc:
            detail = str(exc).splitlines()[0]
            problems.add(f"{_dotted(path)}: '{text}' ({source}) cannot be resolved: {detail}",
                         hint=interpolation_fix(detail))
    problems.raise_if_any()
    out = cast(dict[str, Any], OmegaConf.to_container(config, resolve=True))
    _retype(out, found)
    return out, {_dotted(path): text for path, text in found}


def _retype(tree: dict[str, Any], found: list[tuple[tuple[str | int, ...], str]]) -> None:
    """The resolved scalars of references typed as Trinity-RFT's config would type them."""
    for path, _ in found:
        node: Any = tree
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = _typed(node[path[-1]])
