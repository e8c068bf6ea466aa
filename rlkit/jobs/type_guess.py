"""A config without `type`: fine when it can only be a generate job, else an error naming the types it fits.

AReaL picks the algorithm by its entry script, so its configs carry no `type`; rlkit's schema default, generate,
would then silently turn a GRPO config into a generate job that complains about generate.dataset.path. A config is
obviously a generate job when its layout has no trainer, or when it sets the generate section and no section that
only a trainer reads; it is obviously an sft, rw or dpo job when its training rows say so and nothing else disagrees.
What implies a job type is asked of its record (JobType.own_section, JobType.rows), never of a list of names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlkit.config.allocation import parse_allocation
from rlkit.errors import ConfigError

if TYPE_CHECKING:
    from rlkit.jobs.base import JobType

# sections every trainer reads and no client does (a generate job reads actor.path: the model its servers load), to
# which each trainer's own section adds
_TRAINER_SECTIONS = ("train_dataset", "valid_dataset", "ref", "reward")
_DEFAULT_ROWS = "rl"  # train_dataset.type when the rows do not say


def _has_trainer(allocation_mode: Any) -> bool | None:
    """Whether the layout has a trainer part; None when allocation_mode is missing or unreadable (reported
    elsewhere)."""
    if not isinstance(allocation_mode, str) or not allocation_mode.strip():
        return None
    try:
        return parse_allocation(allocation_mode).trainer is not None
    except ConfigError:
        return None


def training_sections(jobs: Sequence[JobType]) -> tuple[str, ...]:
    """The sections only a trainer reads."""
    return (*_TRAINER_SECTIONS, *(job.own_section for job in jobs if job.trainer and job.own_section))


def fitting_types(data: dict[str, Any], jobs: Sequence[JobType]) -> list[str]:
    """The job types a config fits, most likely first, from the sections it sets and its training rows' type: the
    own sections of trainer-only types first (they hold all of such a job's knobs), then of trainers with servers,
    then the types the rows are of, then the client types' own sections."""
    fits: list[str] = []
    trainers = sorted((job for job in jobs if job.trainer), key=lambda job: job.needs_servers)
    rows = data.get("train_dataset")
    row_type = rows.get("type", _DEFAULT_ROWS) if isinstance(rows, dict) else None
    fits += [job.name for job in trainers if job.own_section and job.own_section in data]
    if isinstance(row_type, str):
        fits += [job.name for job in jobs if job.rows and job.rows == row_type]
    elif "actor" in data and not fits:
        fits += [job.name for job in jobs if job.trainer]
    fits += [job.name for job in jobs if not job.trainer and job.own_section and job.own_section in data]
    return list(dict.fromkeys(fits)) or [job.name for job in jobs]


def job_type_of(merged: dict[str, Any], jobs: Sequence[JobType]) -> str | ConfigError | None:
    """For a config without `type` (`merged`: the file with the overrides over it): None when type is set or the
    config is obviously a generate job (the schema's default), the one type its training rows' own type allows
    (`train_dataset.type: sft`, `rw` or `dpo`, as AReaL writes them), else the error naming the types it fits. Rows
    of type rl stay an error: grpo and ppo both read them, and rlkit does not guess the algorithm."""
    if "type" in merged:
        return None
    trainer = _has_trainer(merged.get("allocation_mode"))
    if trainer is False:
        return None  # servers only: generate is the one job type without a trainer
    clients = [job.own_section for job in jobs if not job.trainer and job.own_section]
    if any(section in merged for section in clients) and not any(section in merged for section in
                                                                  training_sections(jobs)):
        return None
    fits = fitting_types(merged, jobs)
    rows = merged.get("train_dataset")
    row_type = rows.get("type") if isinstance(rows, dict) else None
    of_rows = [job.name for job in jobs if job.rows and job.rows == row_type]
    if len(fits) == 1 and len(of_rows) == 1 and fits == of_rows:
        return of_rows[0]
    choices = " or ".join(f"type={t}" for t in fits)
    return ConfigError("'type' is not set, and the config is not obviously a generate job (rlkit does not guess "
                       "the algorithm, as AReaL's entry script does)", hint=f"set {choices}")
