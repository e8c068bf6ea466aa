"""A config without `type`: fine when it can only be a generate job, else an error naming the types it fits.

AReaL picks the algorithm by its entry script, so its configs carry no `type`; rlkit's schema default, generate,
would then silently turn a GRPO config into a generate job that complains about generate.dataset.path. A config is
obviously a generate job when its layout has no trainer, or when it sets the generate section and no section that
only a trainer reads; it is obviously an sft, rw or dpo job when its training rows say so and nothing else disagrees.
"""

from __future__ import annotations

from typing import Any

from rlkit.config.allocation import parse_allocation
from rlkit.errors import ConfigError

# sections only a trainer reads (a generate job reads actor.path: the model its servers load)
TRAINING_SECTIONS = ("train_dataset", "valid_dataset", "critic", "ref", "reward", "sft", "rw", "dpo")
_BY_ROWS = {"sft": ("sft",), "rw": ("rw",), "dpo": ("dpo",), "rl": ("grpo", "ppo")}


def _has_trainer(allocation_mode: Any) -> bool | None:
    """Whether the layout has a trainer part; None when allocation_mode is missing or unreadable (reported
    elsewhere)."""
    if not isinstance(allocation_mode, str) or not allocation_mode.strip():
        return None
    try:
        return parse_allocation(allocation_mode).trainer is not None
    except ConfigError:
        return None


def fitting_types(data: dict[str, Any]) -> list[str]:
    """The job types a config fits, most likely first, from the sections it sets and its training rows' type."""
    fits: list[str] = []
    rows = data.get("train_dataset")
    row_type = rows.get("type", "rl") if isinstance(rows, dict) else None
    for section in ("sft", "rw", "dpo"):
        if section in data:
            fits.append(section)
    if "critic" in data:
        fits.append("ppo")
    if isinstance(row_type, str):
        fits += _BY_ROWS.get(row_type, ())
    elif "actor" in data and not fits:
        fits += ["grpo", "ppo", "sft", "rw", "dpo"]
    if "generate" in data:
        fits.append("generate")
    return list(dict.fromkeys(fits)) or ["generate", "grpo", "ppo", "sft", "rw", "dpo"]


def job_type_of(merged: dict[str, Any]) -> str | ConfigError | None:
    """For a config without `type` (`merged`: the file with the overrides over it): None when type is set or the
    config is obviously a generate job (the schema's default), the one type its training rows' own type allows
    (`train_dataset.type: sft`, `rw` or `dpo`, as AReaL writes them), else the error naming the types it fits. Rows
    of type rl stay an error: grpo and ppo both read them, and rlkit does not guess the algorithm."""
    if "type" in merged:
        return None
    trainer = _has_trainer(merged.get("allocation_mode"))
    if trainer is False:
        return None  # servers only: generate is the one job type without a trainer
    if "generate" in merged and not any(section in merged for section in TRAINING_SECTIONS):
        return None
    fits = fitting_types(merged)
    rows = merged.get("train_dataset")
    row_type = rows.get("type") if isinstance(rows, dict) else None
    if len(fits) == 1 and row_type in ("sft", "rw", "dpo") and fits == [row_type]:
        return row_type
    choices = " or ".join(f"type={t}" for t in fits)
    return ConfigError("'type' is not set, and the config is not obviously a generate job (rlkit does not guess "
                       "the algorithm, as AReaL's entry script does)", hint=f"set {choices}")
