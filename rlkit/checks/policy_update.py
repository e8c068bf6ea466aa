"""Submit-time check of the PPO actor's update knobs (its entropy bonus, passes, loss average, SAPO, M2PO and the
decoupled loss's proximal policy): refused where the job type has no such update, which would ignore them without a
word; so is the adaptive KL controller (actor.kl_ctl_adaptive) where there is no KL reward penalty. Apart from
rlkit.checks.algo, which the job types' own checks import: this one reads the registry's records."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.config.problems import Problems, refuse_inert_fields
from rlkit.config.schema.actor import ActorConfig

if TYPE_CHECKING:
    from rlkit.jobs.base import JobType
    from rlkit.jobs.job_types import JobTypes

# the fields only rlkit.trainer.actor.PPOActor.train_step reads (sft, rw, dpo and generate read the actor section too)
POLICY_KNOBS = ("entropy_coeff", "ppo_epochs", "loss_agg_mode", "loss_scale_factor", "use_sapo_loss", "sapo_tau_pos",
                "sapo_tau_neg", "m2_threshold", "prox_logp_method")


def validate_policy_knobs(actor: ActorConfig, job: JobType, job_types: JobTypes, problems: Problems) -> None:
    """POLICY_KNOBS belong to the PPO actor's update (rlkit.trainer.actor), which the job types with KL terms train
    through; any other job type would ignore them."""
    if job.kl_terms:
        return
    users = ", ".join(j.name for j in job_types if j.kl_terms)
    if actor.kl_ctl_adaptive is not None:
        problems.add(f"actor.kl_ctl_adaptive is set, but job type {job.name} has no KL reward penalty to adapt (that "
                     f"of {users}): it would be ignored", hint="remove actor.kl_ctl_adaptive")
    refuse_inert_fields(problems, actor, "actor", names=POLICY_KNOBS, hint="remove {field}",
                        because=f"job type {job.name} has no PPO actor update (that of {users})")
