"""Submit-time checks of the reference model (the `ref` section, and dpo.ref_path): every problem collected, each
naming its field and its fix. Torch-free (login node).

The reference scores the actor's token ids, so it must read them as the same tokens: the same vocab_size in its
config.json, and (when both directories hold a tokenizer.json or vocab.json) the same token table as the tokenizer
the job uses (tokenizer_path, else actor.path). A ref.path naming another model where nothing loads a reference
(grpo/ppo with actor.kl_ctl and actor.kl_loss_coef at 0, or a job type without a KL term) would be ignored and is
refused. With actor.use_lora another reference model is loaded as a second frozen copy (rlkit.trainer.reference);
an empty ref.path keeps the base without the adapter as the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.checks.site_files import check_model_dir
from rlkit.checks.token_tables import first_difference
from rlkit.checks.trainer import DTYPES
from rlkit.config.model_config import vocab_size
from rlkit.config.problems import Problems
from rlkit.config.reference import OWN_REFERENCE, own_reference, reference_field, reference_path
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import ConfigError

if TYPE_CHECKING:
    from rlkit.jobs.base import JobType
    from rlkit.jobs.job_types import JobTypes

ATTN_IMPLS = ("flash_attention_2", "sdpa", "eager")


def validate_reference(config: ExperimentConfig, job: JobType, job_types: JobTypes, problems: Problems) -> None:
    """Add every problem of the reference model's settings to `problems` (`job`: config's job type)."""
    _validate_kernel_settings(config, job, job_types, problems)
    ref, actor_path = config.ref.path, config.actor.path
    if ref and ref != actor_path and not job.needs_reference(config):
        problems.add(f"ref.path is set to '{ref}', but {_why_unused(job, job_types)}: it would be ignored",
                     hint=_unused_hint(job))
        return
    own = own_reference(config)
    if ref and own and ref != own:
        own_field = f"{job.name}.{OWN_REFERENCE}"
        problems.add(f"{own_field} ('{own}') and ref.path ('{ref}') both name {job.name}'s reference model, and "
                     f"they differ", hint=f"keep one of them (ref.path is AReaL's name, {own_field} rlkit's older "
                                          "one)")
    if not job.needs_reference(config):
        return
    field, path = reference_field(config), reference_path(config)
    if field == "ref.path":  # dpo.ref_path is checked with the dpo section (rlkit.jobs.pairs.checks)
        with problems.check():
            check_model_dir("ref.path", path)
    if field != "actor.path" and path != actor_path:
        with problems.check():
            check_same_vocabulary(field, path, config)


def _validate_kernel_settings(config: ExperimentConfig, job: JobType, job_types: JobTypes,
                              problems: Problems) -> None:
    """ref.dtype and ref.attn_impl: known values, and never set to something else than the actor's where no
    reference is loaded (it would be ignored)."""
    for name, choices in (("dtype", DTYPES), ("attn_impl", ATTN_IMPLS)):
        value, actors = getattr(config.ref, name), getattr(config.actor, name)
        if not value:
            continue
        if value not in choices:
            problems.add(f"ref.{name} '{value}' is not one of: {', '.join(choices)}",
                         hint=f"e.g. ref.{name}={choices[0]}, or leave it empty for actor.{name}")
        elif value != actors and not job.needs_reference(config):
            problems.add(f"ref.{name} is set to '{value}', but {_why_unused(job, job_types)}: it would be ignored",
                         hint=f"remove ref.{name}" if not job.kl_terms else _unused_hint(job))


def _why_unused(job: JobType, job_types: JobTypes) -> str:
    if job.kl_terms:
        return "actor.kl_ctl and actor.kl_loss_coef are both 0, so no reference model is loaded"
    kl = " and ".join(f"{j.name}'s" for j in job_types if j.kl_terms)
    own = " and ".join(j.name for j in job_types if j.always_reference)
    return f"job type {job.name} loads no reference model (the KL terms are {kl}, {own} has its own)"


def _unused_hint(job: JobType) -> str:
    if job.kl_terms:
        return "remove ref.path, or set actor.kl_ctl (a KL reward penalty) or actor.kl_loss_coef (a KL loss term) > 0"
    return "remove the ref section"


def check_same_vocabulary(field: str, path: str, config: ExperimentConfig) -> None:
    """The reference at `path` reads the actor's token ids as the same tokens (what can be read here is checked)."""
    actor_path = config.actor.path
    theirs, ours = vocab_size(path), vocab_size(actor_path)
    if theirs is not None and ours is not None and theirs != ours:
        raise ConfigError(f"{field}: the reference model '{path}' has vocab_size {theirs}, actor.path's model {ours}: "
                          "its log-probs of the actor's token ids would be of other tokens",
                          hint=f"use a reference with the actor's tokenizer (e.g. the model actor.path was trained "
                               f"from), or leave {field} empty (the reference is then actor.path)")
    tokenizer, tokenizer_field = ((config.tokenizer_path, "tokenizer_path") if config.tokenizer_path else
                                  (actor_path, "actor.path"))
    differs = first_difference(path, tokenizer)
    if differs:
        raise ConfigError(f"{field}: the tokenizer of the reference model '{path}' differs from the job's "
                          f"({tokenizer_field} '{tokenizer}'): {differs}, so the reference would score the "
                          "actor's token ids as other tokens",
                          hint=f"use a reference with the actor's tokenizer, or leave {field} empty (the reference "
                               "is then actor.path)")
