"""The knobs of a multi-stage run (rlkit.launch.stages) that a stage inherits but does not read: the file's top level
and the command line's overrides are every stage's, so `critic.*` written there for a ppo stage also reaches the sft
stage before it, where rlkit.checks.unread_knobs would refuse it. Such a knob is taken out of (reset to its default
in) each stage whose job type does not read it, as long as another stage's does; a knob no stage reads stays, and
is refused with the stage's other problems. A knob the stage sets itself (its own keys, `stages.<name>.` overrides)
is never taken out: written for that stage, it would be ignored there. The same holds for a knob a stage reads only
while another setting is on (rlkit.checks.conditional_knobs): `sft.*` of an sft stage reaches a grpo stage without
expert_dataset, where it is taken out; whether another stage reads it is asked under that stage's own settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlkit.checks.unread_knobs import conditionally_unread, reads_knob, reset_knob, unread_knobs
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.jobs.base import JobType
from rlkit.jobs.job_types import JobTypes


@dataclass(frozen=True)
class StageKeys:
    """One composed stage: its config, its job type and what it sets itself."""

    config: ExperimentConfig
    job: JobType
    own_keys: dict[str, Any]
    own_overrides: list[str]


def stage_sets(own_keys: dict[str, Any], own_overrides: list[str], dotted: str) -> bool:
    """Whether the stage itself (its mapping or its own overrides) sets the field `dotted` or a section above it."""
    node: Any = own_keys
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            break
        node = node[part]
        if not isinstance(node, dict):
            return True  # the field, or a value given for a section above it (an optional one switched off)
    else:
        return True
    keys = [o.split("=", 1)[0].strip() for o in own_overrides]
    return any(key == dotted or dotted.startswith(f"{key}.") or key.startswith(f"{dotted}.") for key in keys)


def drop_other_stages_knobs(stages: Sequence[StageKeys], job_types: JobTypes) -> None:
    """Reset, in each stage, the inherited knobs its job type does not read and another stage's does."""
    for stage in stages:
        others = [s for s in stages if s is not stage]
        fields = [field for _, field in unread_knobs(stage.config, stage.job, job_types)]
        fields += [field for _, field in conditionally_unread(stage.config, stage.job, job_types)]
        for field in fields:
            if any(reads_knob(s.config, s.job, job_types, field) for s in others) and \
                    not stage_sets(stage.own_keys, stage.own_overrides, field):
                reset_knob(stage.config, field)
