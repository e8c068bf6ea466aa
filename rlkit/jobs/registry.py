"""The one list of job types: `type` in a config names one of these. A new job type is a module of its own (its
JobType and its checks) plus one line here."""

from __future__ import annotations

import difflib

from rlkit.errors import ConfigError
from rlkit.jobs.base import JobType
from rlkit.jobs.dpo.job import DPO
from rlkit.jobs.generate.job import GENERATE
from rlkit.jobs.grpo.job import GRPO
from rlkit.jobs.ppo.job import PPO
from rlkit.jobs.rw.job import RW
from rlkit.jobs.sft.job import SFT

_REGISTERED: tuple[JobType, ...] = (GENERATE, GRPO, PPO, SFT, RW, DPO)
JOB_TYPES: tuple[str, ...] = tuple(job.name for job in _REGISTERED)
_BY_NAME = {job.name: job for job in _REGISTERED}
assert len(_BY_NAME) == len(_REGISTERED), "two job types share a name"


def job_type_for(name: str) -> JobType:
    """The job type called `name`; a ConfigError naming the closest registered one otherwise."""
    job = _BY_NAME.get(name)
    if job is not None:
        return job
    close = difflib.get_close_matches(name, JOB_TYPES, n=1, cutoff=0.5)
    guess = f"did you mean '{close[0]}'? " if close else ""
    raise ConfigError(f"type '{name}' is not a job type", hint=f"{guess}choose one of: {', '.join(JOB_TYPES)}")


def registered_job_types() -> tuple[JobType, ...]:
    return _REGISTERED
