"""The knobs a job type reads only while another setting is on: set with that setting off, each would be ignored
without a word, as a knob of a part the job type never reads is (rlkit.checks.unread_knobs, which walks this table
too and refuses each such field the same way: one problem naming it, what is off and the fix; a trial an older
rlkit recorded with it resumes with a warning).

One row per condition: the fields (dotted paths, a section's covering each of its fields), the job types it holds
for (those that read the fields at all: where a job type never reads them, the unconditional check says so), when the
setting is off, and what to say. A row with `warn` is said as a warning, not refused: vLLM's and SGLang's sections
for the backend allocation_mode does not use. AReaL's own example configs carry both sections, tuned away from the
defaults, whichever backend they run (rlkit reads AReaL's files as they are: rlkit.config.areal), and a user keeps
both to switch backends with one override: refusing them would refuse those files, while saying it keeps nobody
believing the other section's memory fraction took effect.
Torch-free and data only: the walking is rlkit.checks.unread_knobs'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlkit.config.allocation import parse_allocation
from rlkit.config.schema.evaluation import evaluation_enabled
from rlkit.config.served_models import (
    CONTEXT_FIELD,
    ENGINE_NUM_FIELD,
    TP_FIELD,
    scores_with_reward_model,
    served_auxiliary_models,
)
from rlkit.errors import ConfigError

if TYPE_CHECKING:
    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.jobs.base import JobType


@dataclass(frozen=True)
class Condition:
    """`fields` are read by the job types `holds_for` accepts only while the setting `off` denies is on. Said as
    "{field} is set, but {because}: it would be ignored", fix "remove {field}, or {fix}"; `warn`: said as a
    warning, the config accepted. `agrees`: (field, value) pairs that say what the setting being off says (reward.fn
    none without generate.score), never refused."""

    fields: tuple[str, ...]
    holds_for: Callable[[JobType], bool]
    off: Callable[[ExperimentConfig], bool]
    because: str
    fix: str
    warn: bool = False
    agrees: tuple[tuple[str, object], ...] = ()


def _serves_without(backend: str) -> Callable[[ExperimentConfig], bool]:
    """Whether no server of the job runs `backend`: neither allocation_mode's servers nor an auxiliary model's
    (which read their backend's section: python, env_vars, extra_args). An allocation_mode that does not parse is
    refused elsewhere: nothing is said here then."""
    def off(config: ExperimentConfig) -> bool:
        try:
            server = parse_allocation(config.allocation_mode).server
        except ConfigError:
            return False
        used = {server.backend} if server is not None else set()
        return backend not in used | {entry.backend for entry in served_auxiliary_models(config)}
    return off


def _actor(*names: str) -> tuple[str, ...]:
    return tuple(f"actor.{name}" for name in names)


# The RL advantages' knobs (rlkit.trainer.rl_math.advantage_batch): the reward's shaping and normalisation, the KL
# reward penalty, GAE, adv_norm, the group estimators. distill with rl_coef 0 computes none of them
# (rlkit.jobs.distill.algorithm: the shaped rewards are only logged); dynamic_sampling, mask_no_eos_with_zero,
# group_size and kl_clamp (also the KL loss term's) it still reads.
_RL_ADVANTAGES = _actor("reward_scaling", "reward_bias", "reward_clip", "reward_norm", "overlong_reward_penalty",
                        "overlong_tokens", "overlong_penalty_factor", "kl_ctl", "kl_ctl_adaptive", "kl_estimator",
                        "kl_penalty_level", "discount", "gae_lambda", "adv_norm", "passk_advantage", "gpg_scale")

_LORA = _actor("lora_rank", "lora_alpha", "target_modules")
# PPO's clipped surrogate's own knobs (rlkit.trainer.rl_math.losses): the dual clip, GSPO's sequence ratio and its
# clamp, SAPO's gate; the other policy losses (actor.policy_loss) read none of them
_PPO_CLIP_ONLY = _actor("c_clip", "importance_sampling_level", "seq_log_ratio_clamp", "use_sapo_loss")

CONDITIONAL_KNOBS: tuple[Condition, ...] = (
    # rlkit.checks.lora and the trainer read them under use_lora only; peft_type's one value is its default (any
    # other is refused by rlkit.checks.lora)
    Condition(_LORA, lambda job: job.lora, lambda c: not c.actor.use_lora,
              "actor.use_lora is false (no LoRA adapters are trained)", "set actor.use_lora=true"),
    # a trainer that never trains adapters (rw, distill); with use_lora set, its own refusal says it
    # (rlkit.checks.experiment), once
    Condition(_LORA, lambda job: job.trainer and not job.lora, lambda c: not c.actor.use_lora,
              "this job type trains no LoRA adapters", "train LoRA with a job type that does (actor.use_lora)"),
    # rlkit.jobs.grpo.expert: the mix's rows (expert_dataset), their format (the sft section) and weight (mix.mu)
    # are read only when expert_dataset.path is set; job type sft reads its own sft section (no expert_dataset)
    Condition(("mix", "expert_dataset", "sft"), lambda job: "expert_dataset" in job.sections,
              lambda c: not c.expert_dataset.path, "expert_dataset.path is not set (the SFT+RL mix is off)",
              "set expert_dataset.path to the expert rows"),
    # rlkit.jobs.generate.step: the reward section scores, and pass_threshold summarises, only with generate.score
    Condition(("reward", "generate.pass_threshold"), lambda job: "generate" in job.sections,
              lambda c: not c.generate.score, "generate.score is false (the completions are not scored)",
              "set generate.score=true", agrees=(("reward.fn", "none"),)),
    # distill.rl_coef 0: no RL advantages (its KL reward penalty too; actor.kl_loss_coef is a KL term it reads)
    Condition(_RL_ADVANTAGES, lambda job: "distill" in job.sections, lambda c: c.distill.rl_coef == 0,
              "distill.rl_coef is 0: distillation computes no RL advantages (reward shaping, KL reward penalty, "
              "GAE, normalisation), the reward is only logged", "set distill.rl_coef > 0"),
    # the KL terms' estimators, read only while their coefficient is on (rlkit.trainer.rl_math.advantage_batch,
    # rlkit.trainer.actor); kl_ctl_adaptive with kl_ctl 0 is refused in its own words (rlkit.checks.algo)
    Condition(_actor("kl_estimator", "kl_penalty_level"), lambda job: job.trains_on_rollouts,
              lambda c: c.actor.kl_ctl == 0,
              "actor.kl_ctl is 0 (no KL reward penalty)", "set actor.kl_ctl > 0"),
    Condition(_actor("kl_loss_type"), lambda job: job.ppo_update, lambda c: c.actor.kl_loss_coef == 0,
              "actor.kl_loss_coef is 0 (no KL loss term)", "set actor.kl_loss_coef > 0"),
    # actor.policy_loss: the knobs of PPO's clip under another loss; GPG's loss has no ratio to clip or clamp
    Condition(_PPO_CLIP_ONLY, lambda job: job.clipped_loss, lambda c: c.actor.policy_loss != "ppo",
              "actor.policy_loss is not ppo (the dual clip, GSPO's sequence ratio and SAPO's gate are PPO clip's)",
              "set actor.policy_loss=ppo"),
    Condition(_actor("eps_clip", "eps_clip_higher", "log_ratio_clamp"), lambda job: job.clipped_loss,
              lambda c: c.actor.policy_loss == "gpg", "actor.policy_loss is gpg (-A log pi: no ratio, no clip)",
              "use another actor.policy_loss"),
    # evaluation during training (rlkit.checks.evaluation refuses valid_dataset.path without it): its sampling and
    # prompt count are read only when a trigger is on
    Condition(("eval_gconfig", "evaluator.max_prompts"), lambda job: "evaluator" in job.sections,
              lambda c: not evaluation_enabled(c.evaluator), "the evaluator never runs (no freq_steps, freq_epochs, "
              "freq_secs or eval_on_startup)", "set evaluator.freq_steps (or another trigger)"),
    # the reward model's servers (rlkit.config.served_models): started only by job types whose reward functions may
    # ask servers, only for a reward that calls reward_model; their size only when there are any
    Condition((ENGINE_NUM_FIELD, TP_FIELD, CONTEXT_FIELD), lambda job: job.auxiliary,
              lambda c: not scores_with_reward_model(c.reward),
              "the reward does not call reward_model (reward.fn, reward.fns)", "score with reward_model"),
    Condition((TP_FIELD, CONTEXT_FIELD), lambda job: job.auxiliary,
              lambda c: c.reward.reward_model_engine_num == 0,
              f"{ENGINE_NUM_FIELD} is 0 (trainer rank 0 scores with the reward model on its CPU)",
              f"set {ENGINE_NUM_FIELD} > 0 to serve it"),
    Condition((ENGINE_NUM_FIELD, TP_FIELD, CONTEXT_FIELD), lambda job: "reward" in job.sections and not job.auxiliary,
              lambda c: True, "this job type scores on its own step, where the reward model is loaded: it starts "
              "no servers for it", "score with the reward model loaded there"),
    # a server backend's section where no server of the job runs it: a warning (this module's docstring says why)
    *(Condition((backend,), lambda job: True, _serves_without(backend),
                f"no server of this job runs {backend} (allocation_mode's servers, auxiliary_models' backends)",
                f"serve with {backend}", warn=True) for backend in ("vllm", "sglang")),
)
