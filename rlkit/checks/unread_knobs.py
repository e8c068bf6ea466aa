"""Submit-time check of knobs the job type never reads: one schema, many job types, and a field set away from its
schema default (the YAML with the overrides over it) in a part that config.type does not read would be ignored
without a word, while its user believes it took effect. Each such field is one problem naming it, the job type and
the fix.

Which job type reads what is asked of its record (rlkit.jobs.base.JobType), never of a list of names: a config
section belongs to the job types whose `sections` name it; the actor's fields are grouped below by what reads them
(the trainer, the rollouts' rewards and advantages, the weight pushes to the servers, the PPO actor's update, PPO's
clipped loss), each group asking one attribute of the record. A new job type sets its record's attributes only.
Fields another check refuses in its own words (actor.use_lora, actor.init_from_scratch, rollout.agent, ref,
auxiliary_models) are left to it. Apart from rlkit.checks.algo, which the job types' own checks import: this one
reads the registry's records.

A field a job type reads only while another setting is on (LoRA's rank with use_lora false, the SFT+RL mix's
weight without its rows, ...) is refused the same way, from rlkit.checks.conditional_knobs' table.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlkit.checks.conditional_knobs import CONDITIONAL_KNOBS, Condition
from rlkit.config.schema.experiment import ExperimentConfig, get_field, set_field
from rlkit.config.schema.walk import section_type

if TYPE_CHECKING:
    from rlkit.config.problems import Problems
    from rlkit.jobs.base import JobType
    from rlkit.jobs.job_types import JobTypes


@dataclass(frozen=True)
class Knobs:
    """Fields (dotted paths; a section's covers each of its fields) that only the job types `reads` accepts read;
    `what`: what the others lack, said as "job type sft has no {what} (that of grpo, ...)"."""

    fields: tuple[str, ...]
    reads: Callable[[JobType], bool]
    what: str


def _actor(*names: str) -> tuple[str, ...]:
    return tuple(f"actor.{name}" for name in names)


# The actor section's fields by what reads them (rlkit.trainer.engine, rlkit.trainer.rl_math.advantage_batch,
# rlkit.weights, rlkit.trainer.actor.PPOActor.train_step, rlkit.trainer.rl_math.losses.ppo_actor_loss). actor.path is
# every job type's (a generate job's servers load it); use_lora and init_from_scratch are refused by their own checks.
ACTOR_KNOBS = (
    Knobs((*_actor("dtype", "gradient_checkpointing", "disable_dropout", "attn_impl", "mb_spec", "fsdp",
                   "logprob_chunk_tokens", "optimizer", "lora_rank", "lora_alpha", "target_modules", "peft_type"),
           "total_train_epochs", "total_train_steps"),
          lambda job: job.trainer, "trainer"),
    Knobs((*_actor("weight_update_mode", "weight_update_delta", "weight_chunked_mem_mb", "weight_update_timeout",
                   "weight_update_interval", "weight_update_offset", "weight_check_tolerance",
                   "logprob_mismatch_warn"), "async_training"),
          lambda job: job.trains_on_rollouts, "weight pushes to rollout servers"),
    Knobs(_actor("group_size", "reward_scaling", "reward_bias", "reward_clip", "reward_norm", "passk_advantage",
                 "gpg_scale", "overlong_reward_penalty", "overlong_tokens", "overlong_penalty_factor",
                 "mask_no_eos_with_zero", "kl_ctl", "kl_estimator", "kl_penalty_level", "kl_clamp",
                 "kl_ctl_adaptive", "discount", "gae_lambda", "adv_norm", "dynamic_sampling"),
          lambda job: job.trains_on_rollouts, "rewards and advantages of rollouts"),
    Knobs(_actor("ppo_n_minibatches", "ppo_epochs", "entropy_coeff", "loss_agg_mode", "loss_scale_factor",
                 "kl_loss_coef", "kl_loss_type", "use_decoupled_loss", "prox_logp_method", "recompute_logprob"),
          lambda job: job.ppo_update, "PPO actor update"),
    Knobs(_actor("eps_clip", "eps_clip_higher", "c_clip", "importance_sampling_level", "log_ratio_clamp",
                 "seq_log_ratio_clamp", "behav_imp_weight_cap", "rejection_sampling", "use_sapo_loss", "sapo_tau_pos",
                 "sapo_tau_neg", "m2_threshold", "policy_loss"),
          lambda job: job.clipped_loss, "PPO clipped loss"),
)
# The actor's fields in no group: every job type's (the servers' model), or refused by a check of their own.
ACTOR_ELSEWHERE = _actor("path", "use_lora", "init_from_scratch")
# Sections read in part beyond the job types naming them: the job types that evaluate valid_dataset at each epoch's
# end (sft, rw, dpo) read the evaluator's frequencies (rlkit.checks.experiment refuses all but freq_epochs 1).
_ALSO_READ_BY: dict[str, Callable[[JobType], bool]] = {"evaluator": lambda job: "valid_dataset" in job.sections}
# Subsections another check refuses in its own words.
_OWN_CHECKS = ("rollout.agent",)
# A field whose default is another field (rlkit.config.load fills actor.group_size in as ${gconfig.n_samples}).
_DEFAULTS_TO = {"actor.group_size": "gconfig.n_samples"}
# A field whose empty default means another field's value: that value is no setting either (AReaL's files write
# vllm.model: ${actor.path}); reset, it is emptied as its default says.
_SAME_AS = {"vllm.model": "actor.path", "sglang.model_path": "actor.path"}
# AReaL's own defaults where they are not rlkit's (its config reference, ../shared/seeds/areal-config-reference-v1.md):
# an AReaL file writing them has set nothing
_AREAL_DEFAULTS: dict[str, Any] = {"vllm.max_model_len": 32768, "vllm.enforce_eager": True,
                                   "vllm.enable_prefix_caching": False, "sglang.context_length": 32768,
                                   "sglang.disable_radix_cache": True}


def knob_table(job_types: JobTypes) -> tuple[Knobs, ...]:
    """Every part of the schema that only some job types read: the actor's groups, then each section some job type's
    `sections` name (the actor's excepted: its groups say more)."""
    sections = dict.fromkeys(s for job in job_types for s in job.sections if s != "actor")
    return (*ACTOR_KNOBS, *(Knobs((s,), _section_reader(s), "") for s in sections))


def _section_reader(section: str) -> Callable[[JobType], bool]:
    also = _ALSO_READ_BY.get(section, lambda job: False)
    return lambda job: section in job.sections or also(job)


def validate_unread_knobs(config: ExperimentConfig, job: JobType, job_types: JobTypes, problems: Problems) -> None:
    """One problem per field set in a part of the schema job type `job` does not read."""
    for knobs, field in unread_knobs(config, job, job_types):
        users = ", ".join(j.name for j in job_types if knobs.reads(j))
        if knobs.what:
            because = f"job type {job.name} has no {knobs.what} (that of {users})"
        else:
            section = knobs.fields[0]
            because = f"{section}.* is read by job type{'s' if ',' in users else ''} {users} only, not {job.name}"
        # recorded_ok: a trial an older rlkit accepted with it resumes (warned), it was ignored all along
        problems.add(f"{field} is set, but {because}: it would be ignored", hint=f"remove {field}", recorded_ok=field)
    noted: dict[Condition, list[str]] = {}
    for condition, field in conditionally_unread(config, job, job_types):
        if condition.warn:
            noted.setdefault(condition, []).append(field)
            continue
        problems.add(f"{field} is set, but {condition.because}: it would be ignored",
                     hint=f"remove {field}, or {condition.fix}", recorded_ok=field)
    for condition, fields in noted.items():  # one line per section
        problems.note(f"{', '.join(fields)} {'is' if len(fields) == 1 else 'are'} set, but {condition.because}: "
                      f"not used (remove {'it' if len(fields) == 1 else 'them'}, or {condition.fix})")


def unread_knobs(config: ExperimentConfig, job: JobType, job_types: JobTypes) -> list[tuple[Knobs, str]]:
    """(the part, the field) of each field set away from its default that `job` does not read."""
    return [(knobs, field) for knobs in knob_table(job_types) if not knobs.reads(job)
            for path in knobs.fields for field in set_fields(config, path)]


def conditionally_unread(config: ExperimentConfig, job: JobType, job_types: JobTypes) -> list[tuple[Condition, str]]:
    """(the condition, the field) of each field set away from its default that `job` would read but for a setting
    of `config` that is off; a field `job` never reads is left to unread_knobs (said once, by the first row)."""
    said = {field for _, field in unread_knobs(config, job, job_types)}
    found: list[tuple[Condition, str]] = []
    for condition in CONDITIONAL_KNOBS:
        if condition.holds_for(job) and condition.off(config):
            for path in condition.fields:
                for field in set_fields(config, path):
                    if field not in said and (field, get_field(config, field)) not in condition.agrees:
                        said.add(field)
                        found.append((condition, field))
    return found


def reads_knob(config: ExperimentConfig, job: JobType, job_types: JobTypes, field: str) -> bool:
    """Whether `job` reads the leaf `field` under `config`'s settings (a multi-stage run's other stage:
    rlkit.launch.stage_knobs): in no part it never reads, under no condition that is off."""
    def covers(path: str) -> bool:
        return field == path or field.startswith(f"{path}.")

    if any(not knobs.reads(job) and any(covers(p) for p in knobs.fields) for knobs in knob_table(job_types)):
        return False
    return not any(c.holds_for(job) and c.off(config) and any(covers(p) for p in c.fields) for c in CONDITIONAL_KNOBS)


def set_fields(config: ExperimentConfig, path: str) -> Iterator[str]:
    """The leaf fields under `path` whose value is not the schema's default (a section's: its own factory's, as the
    critic's optimizer has another learning rate than the actor's)."""
    if path in _OWN_CHECKS:
        return
    value, default = get_field(config, path), _default(path)
    if path in _DEFAULTS_TO:
        default = get_field(config, _DEFAULTS_TO[path])
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and type(value) is type(default):
        parent: type = type(value)
        for f in dataclasses.fields(parent):
            sub = f"{path}.{f.name}"
            if section_type(parent, f.name) is not None and getattr(default, f.name) is not None:
                yield from set_fields(config, sub)
            elif (getattr(value, f.name) != getattr(default, f.name)
                  and not _no_setting(config, sub, getattr(value, f.name))):
                yield sub
    elif value != default and not _no_setting(config, path, value):
        yield path


def _no_setting(config: ExperimentConfig, path: str, value: Any) -> bool:
    """Whether `value` of `path`, not rlkit's default, still sets nothing: the field its empty default stands for
    (_SAME_AS), or AReaL's default (_AREAL_DEFAULTS)."""
    if path in _SAME_AS and value == get_field(config, _SAME_AS[path]):
        return True
    return path in _AREAL_DEFAULTS and value == _AREAL_DEFAULTS[path]


_SCHEMA_DEFAULTS = ExperimentConfig()  # read only (reset_knob copies what it takes)


def _default(path: str) -> Any:
    """The schema's default of a dotted field path."""
    return get_field(_SCHEMA_DEFAULTS, path)


def reset_knob(config: ExperimentConfig, field: str) -> None:
    """Give `field` its default back (a multi-stage run's stage that inherits a knob it does not read:
    rlkit.launch.stage_knobs)."""
    if field in _DEFAULTS_TO:
        set_field(config, field, get_field(config, _DEFAULTS_TO[field]))
        return
    was = get_field(config, field)
    set_field(config, field, copy.deepcopy(_default(field)))
    for follower, source in _DEFAULTS_TO.items():  # a field that took this one's value as its default follows it
        if source == field and get_field(config, follower) == was:
            set_field(config, follower, get_field(config, field))
