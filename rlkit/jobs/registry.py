"""The one list of job types: `type` in a config names one of these. A new job type is a module of its own (its
JobType and its checks) plus one line here."""

from __future__ import annotations

from rlkit.jobs.base import JobType
from rlkit.jobs.distill.job import DISTILL
from rlkit.jobs.dpo.job import DPO
from rlkit.jobs.generate.job import GENERATE
from rlkit.jobs.grpo.job import GRPO
from rlkit.jobs.job_types import JobTypes
from rlkit.jobs.opmd.job import OPMD
from rlkit.jobs.ppo.job import PPO
from rlkit.jobs.rw.job import RW
from rlkit.jobs.sft.job import SFT

REGISTRY = JobTypes((GENERATE, GRPO, PPO, OPMD, SFT, RW, DPO, DISTILL))
JOB_TYPES: tuple[str, ...] = REGISTRY.names


def job_type_for(name: str) -> JobType:
    """The job type called `name`; a ConfigError naming the closest registered one otherwise."""
    return REGISTRY.named(name)


def registered_job_types() -> tuple[JobType, ...]:
    return REGISTRY.all
