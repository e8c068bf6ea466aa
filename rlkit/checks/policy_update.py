"""Submit-time check of the PPO actor's update knobs (actor.entropy_coeff, actor.ppo_epochs): refused where the job
type has no such update, which would ignore them without a word. Apart from rlkit.checks.algo, which the job types'
own checks import: this one reads the registry's records."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.config.problems import Problems, refuse_inert_fields
from rlkit.config.schema.actor import ActorConfig

if TYPE_CHECKING:
    from rlkit.jobs.base import JobType
    from rlkit.jobs.job_types import JobTypes


def validate_policy_knobs(actor: ActorConfig, job: JobType, job_types: JobTypes, problems: Problems) -> None:
    """actor.entropy_coeff and actor.ppo_epochs belong to the PPO actor's update (rlkit.trainer.actor), which the job
    types with KL terms train through; any other job type would ignore them."""
    if job.kl_terms:
        return
    users = ", ".join(j.name for j in job_types if j.kl_terms)
    refuse_inert_fields(problems, actor, "actor", names=("entropy_coeff", "ppo_epochs"), hint="remove {field}",
                        because=f"job type {job.name} has no PPO actor update (that of {users})")
