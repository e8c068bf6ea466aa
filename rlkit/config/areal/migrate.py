"""`rlkit migrate FILE`: the rlkit config an AReaL config file becomes, so a user can keep one clean file.

The text is the file's own mapping as rlkit's loader reads it (rlkit.config.load.areal_to_rlkit: AReaL's names
moved to rlkit's keys, the per-engine layout fields turned into allocation_mode, `type` settled), with every AReaL
key rlkit has no field for left out and listed in the header comment with what became of it. `${...}` references
stay as written. The file is checked exactly as `render` checks it first (refusals exit 2; site files that cannot
be read here are warnings), and the migrated text loads to the same configuration with no AReaL key left.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, cast

from omegaconf import OmegaConf

from rlkit.config.areal.accept import AcceptedKey, FoundKey
from rlkit.config.areal.rules import RENAMED, USED, show
from rlkit.config.job_facts import JobTypeLookup
from rlkit.config.load import areal_to_rlkit, compose, parse_overrides, read_yaml, typed_config
from rlkit.config.problems import Problems
from rlkit.errors import ConfigError

_EXPONENT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+")
_SHOWN_VALUE = 60  # characters of a dropped value in the header


def migrate(path: Path, overrides: list[str], job_types: JobTypeLookup) -> tuple[str, list[ConfigError]]:
    """The migrated text of `path` (`overrides` merged into it, e.g. `type=grpo` or site paths) and the warnings
    about site files that could not be checked; ConfigErrors when the file has problems (every one listed).
    `job_types` (rlkit.jobs.REGISTRY): as for rlkit.config.load.compose."""
    problems = Problems()
    accepted: list[AcceptedKey] = []
    data = read_yaml(path)
    typed_config(compose(copy.deepcopy(data), list(overrides), source=str(path), problems=problems,
                         accepted=accepted, job_types=job_types, require_type=True))
    problems.raise_if_any(allow_site=True)
    override_tree = cast(dict[str, Any], OmegaConf.to_container(parse_overrides(overrides)))
    kept, kept_overrides, found = areal_to_rlkit(data, override_tree, source=str(path), problems=Problems(),
                                                  require_type=job_types)
    merged = OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(kept), OmegaConf.create(kept_overrides)))
    header = _header(path, found, accepted)
    return header + OmegaConf.to_yaml(_floats(merged)), list(problems.site_warnings())


def _floats(value: Any) -> Any:
    """`5e-6` as the number it is: the YAML reader takes exponent notation without a dot for a string (the schema
    converts it when loading), which the output would otherwise quote."""
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats(v) for v in value]
    return float(value) if isinstance(value, str) and _EXPONENT.fullmatch(value) else value


def _header(path: Path, found: list[FoundKey], accepted: list[AcceptedKey]) -> str:
    reasons = {item.key: f"{item.kind}: {item.why}" for item in accepted}
    lines = [f"# rlkit config written by `rlkit migrate` from {path.name}."]
    if found or "type" in reasons:  # no heading over an empty list (a Trinity-RFT file's mapping has no AReaL key)
        lines.append("# The AReaL keys of that file rlkit has no field for, and what became of each:")
    for item in sorted(found, key=lambda f: f.key):
        value = show(item.value)
        if len(value) > _SHOWN_VALUE:
            value = value[:_SHOWN_VALUE - 3] + "..."
        if item.rule.kind == USED:
            fate = "read into allocation_mode"
        elif item.rule.kind == RENAMED:
            fate = f"moved to {item.rule.renamed_to}"
        else:
            fate = f"left out ({reasons.get(item.key, item.rule.why)})"
        lines.append(f"#   {item.key}: {value}  -> {fate}")
    if "type" in reasons:
        lines.append(f"#   type: written below ({reasons['type']})")
    return "\n".join(line.replace("\n", " ") for line in lines) + "\n\n"
