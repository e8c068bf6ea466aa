"""Submit-time checks of Ulysses sequence parallelism (`actor.fsdp.ulysses_sp_size`, rlkit.models.ulysses): every
problem that would otherwise stop the trainer minutes into the queue, or silently train without it, is named here.

What the trainer needs: packed micro-batches (only a packed row is split), attention heads that divide over the sp
ranks (KV heads too, or fewer KV heads that divide sp: each is then repeated, as verl does), a model family whose
attention goes through transformers' attention registry as rlkit's Ulysses attention expects, sp dividing the
trainer's ranks, and a job type whose every trained forward goes through the split (grpo, opmd: the actor; sft;
ppo: the actor and its critic). PPO's trainer runs both models in one process, which holds one sp layout, so the
critic's own key (`critic.fsdp.ulysses_sp_size`, as AReaL's critic has its own fsdp section) must equal the actor's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlkit.config.allocation import Allocation
from rlkit.config.model_config import read_model_config
from rlkit.config.problems import Problems
from rlkit.config.schema.actor import ULYSSES_MODEL_TYPES
from rlkit.config.schema.experiment import ExperimentConfig

if TYPE_CHECKING:
    from rlkit.jobs.base import JobType
    from rlkit.jobs.job_types import JobTypes

FIELD = "actor.fsdp.ulysses_sp_size"
CRITIC_FIELD = "critic.fsdp.ulysses_sp_size"
MODEL_TYPES = ULYSSES_MODEL_TYPES


def validate_sequence_parallel(config: ExperimentConfig, job: JobType, job_types: JobTypes,
                               allocation: Allocation | None, problems: Problems) -> None:
    """Add every problem of actor.fsdp.ulysses_sp_size > 1 for job type `job` to `problems` (nothing for 1)."""
    sp = config.actor.fsdp.ulysses_sp_size
    has_critic = "critic" in job.sections
    if has_critic:
        _validate_critic(config, sp, problems)
    if sp <= 1:  # below 1: its range's
        return
    if not job.sequence_parallel:
        splitting = ", ".join(other.name for other in job_types if other.sequence_parallel)
        problems.add(f"{FIELD}={sp} with job type {job.name}: its trainer does not split sequences yet (Ulysses "
                     f"runs in {splitting})", hint=f"set {FIELD}=1")
    if not config.actor.mb_spec.packing:
        problems.add(f"{FIELD}={sp} needs packed micro-batches (only a packed row is split over the sp ranks), but "
                     "actor.mb_spec.packing is false", hint=f"set actor.mb_spec.packing=true or {FIELD}=1")
    if allocation is not None and allocation.trainer is not None and allocation.trainer.dp % sp:
        problems.add(f"{FIELD}={sp} does not divide the trainer's {allocation.trainer.dp} GPUs "
                     f"(allocation_mode {config.allocation_mode}): every sp group needs {sp} ranks",
                     hint=f"use a multiple of {sp} trainer GPUs, or an sp size that divides "
                          f"{allocation.trainer.dp}")
    _validate_model(config.actor.path, "actor.path", sp, problems)
    if has_critic and config.critic.path and config.critic.path != config.actor.path:
        _validate_model(config.critic.path, "critic.path", sp, problems)


def _validate_critic(config: ExperimentConfig, sp: int, problems: Problems) -> None:
    """The critic splits its rows as the actor does: the same sp size (one layout per trainer process), packed."""
    critic_sp = config.critic.fsdp.ulysses_sp_size
    if critic_sp != sp and critic_sp >= 1 and sp >= 1:  # below 1: its range's
        problems.add(f"{CRITIC_FIELD}={critic_sp} differs from {FIELD}={sp}: ppo's trainer runs the actor and the "
                     "critic in one process over the same sequence split, so both need one sp size",
                     hint=f"set {CRITIC_FIELD}={sp} (or {FIELD}={critic_sp})")
    if sp > 1 and critic_sp == sp and not config.critic.mb_spec.packing:
        problems.add(f"{CRITIC_FIELD}={sp} needs packed micro-batches for the critic too, but "
                     "critic.mb_spec.packing is false", hint="set critic.mb_spec.packing=true or both sp sizes to 1")


def _validate_model(path: str, key: str, sp: int, problems: Problems) -> None:
    """The model family and its head counts, from `path`'s config.json (`key` names it; a hub id or an unreadable
    file is left to the trainer, which refuses it the same way)."""
    model = read_model_config(path) if path else None
    if model is None:
        return
    nested = model.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else model
    model_type = text.get("model_type", model.get("model_type"))
    if model_type not in MODEL_TYPES:
        problems.add(f"{FIELD}={sp}: {key} is a {model_type!r} model, whose attention rlkit's Ulysses does not "
                     f"serve (it serves {', '.join(MODEL_TYPES)})", hint=f"set {FIELD}=1")
    heads = text.get("num_attention_heads")
    kv_heads = text.get("num_key_value_heads", heads)
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or min(heads, kv_heads) < 1:
        problems.add(f"{FIELD}={sp}: {key}'s config.json names no valid num_attention_heads / "
                     f"num_key_value_heads ({heads!r} / {kv_heads!r})", hint=f"set {FIELD}=1")
        return
    if heads % sp:
        problems.add(f"{FIELD}={sp} does not divide the model's {heads} attention heads: each sp rank attends with "
                     "heads / sp of them", hint=f"use an sp size that divides {heads}")
    if kv_heads % sp and sp % kv_heads:
        problems.add(f"{FIELD}={sp} and the model's {kv_heads} KV heads: neither divides the other, so the KV heads "
                     "cannot be dealt (or repeated) over the sp ranks",
                     hint=f"use an sp size that divides {kv_heads} or is a multiple of it")
