"""Experiment and trial names: they become directory names, Slurm job names and squeue columns, so one rule holds
for every place that takes or makes one (the submit checks, the stage records, `rlkit migrate`'s names from another
system's run)."""

from __future__ import annotations

import re

from rlkit.errors import ConfigError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_NAME_LENGTH = 64  # experiment and trial names: directory names, Slurm job names, squeue columns
RULE = "letters, digits, '.', '_' and '-' (starting with a letter or digit), without '/' or spaces"


def check_name(field: str, value: str) -> None:
    """Experiment and trial names become directory names and Slurm job names."""
    if not NAME.fullmatch(value):
        raise ConfigError(f"{field} '{value}' is not allowed: use {RULE}",
                          hint=f"e.g. {field}={'math-grpo' if field == 'experiment_name' else 'run_1'}")
    if len(value) > MAX_NAME_LENGTH:
        raise ConfigError(f"{field} is {len(value)} characters long; at most {MAX_NAME_LENGTH} are allowed "
                          "(it names directories and the Slurm job)", hint=f"shorten {field}")


def name_like(value: str) -> str:
    """The nearest allowed name to `value` (each run of other characters made one '_'), or "" when none is left."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", value).lstrip("._-")[:MAX_NAME_LENGTH].rstrip("_")
