"""AReaL's keys that rlkit's schema lacks, each with its rule and reason (rlkit.config.areal.rules says what the rule
kinds mean). The inference servers' keys are in rlkit.config.areal.server_keys.

Sources: AReaL's configuration reference in its two versions (../shared/seeds/areal-config-reference-v1.md and -v2)
and its example configs. `TABLES` maps each rlkit section path to the table of its AReaL-only keys; a key in no
table and not in the schema stays an unknown key (did-you-mean). A key that rlkit's schema gains later is no longer
looked up here (the schema wins; a unit test asks to drop the entry).

Facts about rlkit these rules rest on (checked in the trainer, keep them true): log-probs of grpo/ppo are computed at
gconfig.temperature (rlkit.jobs.grpo.algorithm builds PPOActor with it), of sft/rw/dpo at temperature 1; FSDP reduces
gradients in float32 and keeps float32 master weights and optimizer states (rlkit.trainer.engine); the last partial
batch of an epoch is dropped (rlkit.jobs.grpo.algorithm.total_steps, offline_epochs); chosen and rejected answers of a
pair always share a micro-batch, and every loss is a mean over a whole minibatch (micro-batching never changes an
update); the reference model of a KL term or of DPO is ref.path's (dpo: dpo.ref_path when set; neither: actor.path),
frozen, in ref.dtype with ref.attn_impl (empty: the actor's; rlkit.trainer.reference); the overlong penalty uses
gconfig.max_new_tokens; there is no float16 loss scaling; dropout layers are left as the model's config.json has them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rlkit.config.areal.rules import (
    Rule,
    derived,
    inert,
    inert_if,
    off,
    per_job,
    renamed,
    same,
    same_value,
    section,
    used,
)
from rlkit.config.areal.server_keys import SGLANG, VLLM
from rlkit.config.model_config import dropout_free
from rlkit.config.schema.actor import ActorConfig
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.schema.ref import RefConfig

if TYPE_CHECKING:
    from rlkit.config.job_facts import JobFacts

EXPERIMENT = derived("experiment_name", lambda c: c.experiment_name)
TRIAL = derived("trial_name", lambda c: c.trial_name)
FILEROOT = derived("cluster.fileroot", lambda c: c.cluster.fileroot)
TOKENIZER = derived("tokenizer_path (empty: actor.path)", lambda c: c.tokenizer_path or c.actor.path)
NAMES = {"experiment_name": EXPERIMENT, "trial_name": TRIAL}
NAMES_AND_ROOT = {**NAMES, "fileroot": FILEROOT}

PLACEMENT = inert("placement for AReaL's single controller; rlkit places every step from allocation_mode and "
                  "launcher.*")
WORKERS = inert("rlkit reads rows in the trainer itself (no DataLoader workers)")
LOGGING = inert("logging of AReaL's own processes")
LAYOUT = used("the GPU layout, read as allocation_mode (rlkit.config.areal.layout)")
AREAL_RPC = inert("AReaL's controller RPC; rlkit's steps talk through name_resolve with a per-trial token")


def _logprob_temperature(c: ExperimentConfig, job: JobFacts | None) -> float:
    """The temperature rlkit's trainer computes the policy's log-probs at (job: the facts of c's job type)."""
    return c.gconfig.temperature if job is not None and job.trains_on_rollouts else 1.0


def _value_model(job: JobFacts | None) -> bool:
    return job is not None and job.trains_value_model


def _needs_reference(c: ExperimentConfig, job: JobFacts | None) -> bool:
    return job is not None and job.needs_reference(c)


def _max_tokens_never_binding(value: object, c: ExperimentConfig) -> bool:
    """gconfig.max_tokens (prompt + completion) changes nothing when no prompt can reach it."""
    longest_prompt = c.train_dataset.max_length
    return value is None or (isinstance(value, int) and longest_prompt is not None
                             and value >= longest_prompt + c.gconfig.max_new_tokens)


FLOAT32 = same("rlkit reduces gradients and keeps master weights and optimizer states in float32",
               lambda v, c: v == "float32", fix="remove it (rlkit uses float32)", expected=lambda c: "float32")
LOSS_SCALE = inert_if("float16 loss scaling only; the trainer dtype is not float16",
                      lambda v, c: c.actor.dtype != "float16", refused="float16 loss scaling is not supported yet",
                      fix="remove it, or train in actor.dtype=bfloat16")

MB_SPEC: dict[str, Rule] = {
    # AReaL needs granularity 2 to keep a pair in one micro-batch for its pairwise loss; rlkit never splits a pair,
    # and its losses are means over a whole minibatch's tokens (rlkit.trainer.sample_forward.minibatch_steps), so
    # which sequences share a micro-batch changes memory and speed only.
    "granularity": inert("which sequences share a micro-batch: rlkit never splits a pair (rw, dpo), and its losses "
                         "are means over the whole minibatch, so the grouping changes memory, not the update"),
}

OPTIMIZER: dict[str, Rule] = {
    "offload": off("optimizer offload", False),
    **dict.fromkeys(("initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis"), LOSS_SCALE),
}

FSDP: dict[str, Rule] = {
    "wrap_policy": inert("rlkit shards every decoder layer itself (FSDP2)"),
    "offload_params": off("FSDP parameter offload", False),
    "memory_efficient_load": inert("how weights are loaded, not which"),
    "per_layer_optim_step": off("the per-layer optimizer step", False),
    "optim_step_prefetch_layers": inert("read only with per_layer_optim_step"),
    "shard_vision_across_sp": off("vision-encoder sharding", False),
}

# TrainEngine's keys (actor, critic, ref): the model and how it is trained.
ENGINE: dict[str, Rule] = {
    **NAMES,
    "backend": LAYOUT,
    "init_from_scratch": off("random initialisation", False),
    "disable_dropout": same("the model's config.json has no dropout to switch off",
                            lambda v, c: v is False or dropout_free(c.actor.path),
                            refused="switching dropout off is not supported yet, and the model's config.json "
                                    "has dropout (rlkit trains with it)",
                            fix="set it to false, or use a model whose config.json has every dropout at 0"),
    "pad_to_maximum": inert("padding of micro-batches (memory, not results)"),
    "grad_reduce_dtype": FLOAT32,
    "optimizer_dtype": FLOAT32,
    "fsdp": section("FSDP engine settings", FSDP),
    "archon": inert("settings of AReaL's archon engine; rlkit trains with FSDP2"),
    "megatron": inert("settings of AReaL's megatron engine; rlkit trains with FSDP2"),
    "offload": off("parameter and optimizer offload", False),
    "use_kernels": off("Hugging Face kernel replacement", False),
    "enable_tree_training": off("tree training", False),
    "scheduling_spec": PLACEMENT,
    "scheduling_strategy": PLACEMENT,
    "admin_api_key": AREAL_RPC,
    "log_level": LOGGING,
    "request_timeout": AREAL_RPC,
    "setup_timeout": AREAL_RPC,
    "workers_ready_timeout": AREAL_RPC,
}

def _teacher_served(value: object, c: ExperimentConfig) -> bool:
    """AReaL's teacher.path names the model of rlkit's teacher: the auxiliary_models entry distill.teacher."""
    return any(e.name == c.distill.teacher and e.model_path == value for e in c.auxiliary_models)


_SERVED_TEACHER = ("serve the teacher as an auxiliary_models entry ({name: teacher, model_path: ...}) and set type: "
                   "distill (distill.teacher names the entry)")
# AReaL's `teacher` section (on-policy distillation in its PPO trainer): rlkit's job type distill.
TEACHER: dict[str, Rule] = {
    "engine_type": same("rlkit's teacher is served (AReaL's 'rollout' engine: an auxiliary_models entry scored "
                        "through its prompt-logprob route)", lambda v, c: v == "rollout",
                        fix="remove it; a teacher in the trainer ('train') is not built: " + _SERVED_TEACHER,
                        expected=lambda c: "rollout"),
    "rollout": off("the teacher's own inference-engine section", None,
                   fix="remove it: the teacher's servers are its auxiliary_models entry (engine_num, "
                       "tensor_parallel_size, backend, max_model_len) with the vllm/sglang section's settings"),
    "train": off("a trained-engine teacher", None, fix="remove it: " + _SERVED_TEACHER),
    "path": same("the model of the auxiliary_models entry distill.teacher", _teacher_served, fix=_SERVED_TEACHER),
    "offload": off("offloading the teacher between steps", False),
    "rl_loss_weight": renamed("distill.rl_coef", "rlkit keeps distillation's settings in the distill section"),
    "distill_loss_weight": renamed("distill.coef", "rlkit keeps distillation's settings in the distill section"),
}

_SELF_TEACHER = same(
    "the student's own teacher", lambda v, c: False,
    refused="AReaL's self-distillation teacher (an EMA of the student, re-prompted with a successful attempt or "
            "feedback: SDPO) is not built; rlkit's teacher is another model, served, scoring the student's own "
            "prompt and completion", fix="remove it: " + _SERVED_TEACHER)
# AReaL's actor.self_distillation: the loss knobs fit rlkit's distill section; its teacher does not.
SELF_DISTILLATION: dict[str, Rule] = {
    "distillation_topk": renamed("distill.topk", "the top-k forward KL of job type distill"),
    "distillation_add_tail": renamed("distill.add_tail", "the top-k term's tail bucket"),
    "is_clip": renamed("distill.is_clip", "the top-k term's importance-weight bound"),
    **dict.fromkeys(("full_logit_distillation", "alpha", "success_reward_threshold", "teacher_regularization",
                     "teacher_update_rate", "max_reprompt_len", "reprompt_truncation", "dont_reprompt_on_self_success",
                     "remove_thinking_from_demonstration", "reprompt_template", "solution_template",
                     "feedback_template", "include_environment_feedback", "environment_feedback_only_without_solution"),
                    _SELF_TEACHER),
}

ACTOR: dict[str, Rule] = {
    # fields of rlkit's actor (actor.fsdp's AReaL-only keys: TABLES["actor.fsdp"])
    **{key: rule for key, rule in ENGINE.items() if key not in ("disable_dropout", "init_from_scratch", "fsdp")},
    "is_critic": per_job(lambda job: same(
        "the trained model of rw is a scalar-head model, of every other job type a causal LM",
        lambda v, c: v is _value_model(job), fix="remove it (rlkit decides it from type)",
        expected=lambda c: _value_model(job))),
    "temperature": per_job(lambda job: same(
        "rlkit computes log-probs at the sampling temperature (grpo, ppo: gconfig.temperature; sft, rw, dpo: 1)",
        lambda v, c: v == _logprob_temperature(c, job),
        fix="remove it, or set it equal: the servers' behaviour log-probs are at the sampling temperature, and a "
            "ratio of log-probs at two temperatures is no importance weight",
        expected=lambda c: _logprob_temperature(c, job))),
    "max_new_tokens": same_value("gconfig.max_new_tokens", lambda c: c.gconfig.max_new_tokens,
                                 why="rlkit's overlong penalty uses gconfig.max_new_tokens"),
    "log_agent_stats": inert("rlkit logs its agent/* metrics for every multi-turn run"),
    "log_agent_stats_keys": inert("rlkit logs its agent/* metrics for every multi-turn run"),
    "beta": renamed("dpo.beta", "rlkit keeps DPO's settings in the dpo section"),
    "loss_type": renamed("dpo.loss_type", "rlkit keeps DPO's settings in the dpo section"),
    "behave_imp_weight_cap": renamed("actor.behav_imp_weight_cap", "AReaL's name until 2026-03"),
    "self_distillation": section("AReaL's self-distillation (SDPO); its loss knobs map to the distill section",
                                 SELF_DISTILLATION),
    "behave_imp_weight_mode": same("tokens whose behaviour importance weight exceeds the cap are masked (AReaL's "
                                   "token_mask)", lambda v, c: v == "token_mask",
                                   fix="remove it, or set actor.rejection_sampling (level, action) for the other "
                                       "modes", expected=lambda c: "token_mask"),
}

CRITIC: dict[str, Rule] = {
    # fields of rlkit's critic (critic.fsdp's AReaL-only keys: TABLES["critic.fsdp"])
    **{key: rule for key, rule in ENGINE.items() if key not in ("disable_dropout", "fsdp")},
    "is_critic": same("rlkit's critic is a value model", lambda v, c: v is True, fix="remove it",
                      expected=lambda c: True),
    "temperature": inert("a value model has no sampling temperature"),
    "weight_update_mode": inert("the critic's weights never go to the servers"),
    "use_lora": off("LoRA for the critic", False),
    **dict.fromkeys(("lora_rank", "lora_alpha", "target_modules", "peft_type"),
                    inert("read only with critic.use_lora")),
}


_FROZEN = inert("AReaL reads it for a trained model only; the reference is frozen")
_REF_FIELDS = {f.name for f in dataclasses.fields(RefConfig)}
# The keys of AReaL's ref section that rlkit's `ref` section (rlkit.config.schema.ref) lacks: `path`, `dtype` and
# `attn_impl` are fields.
REF: dict[str, Rule] = {
    **{f.name: _FROZEN for f in dataclasses.fields(ActorConfig) if f.name not in _REF_FIELDS},
    **{key: _FROZEN for key in ACTOR if key not in ENGINE},  # AReaL's PPO knobs, read for the actor only
    **ENGINE,
    "fsdp": section("FSDP engine settings", {**FSDP, "ulysses_sp_size": inert(
        "the reference's forwards run whole on every trainer rank; actor.fsdp.ulysses_sp_size splits the actor's")}),
    "use_lora": off("LoRA on the reference", False),
    "disable_dropout": inert("the reference runs in eval mode (no dropout either way)"),
    "is_critic": off("a critic as reference", False),
    "temperature": per_job(lambda job: same(
        "the reference's log-probs are taken at the actor's temperature",
        lambda v, c: not _needs_reference(c, job) or v == _logprob_temperature(c, job),
        fix="remove it", expected=lambda c: _logprob_temperature(c, job))),
    "mb_spec": inert("rlkit runs the reference with actor.mb_spec (micro-batching changes memory, not results)"),
    "optimizer": inert("the reference is never stepped"),
    "gradient_checkpointing": inert("the reference runs no backward pass"),
}

TOP: dict[str, Rule] = {
    "enable_offload": off("training offload (torch_memory_saver)", False),
    "total_train_n_seqs": off("a sample budget", None, fix="remove it (use total_train_steps)"),
    "dynamic_bs": off("dynamic batch sizing", False),
    "scheduler": inert("AReaL's scheduler; rlkit is launched by Slurm itself"),
    "perf_tracer": section("AReaL's performance tracer", {
        **NAMES_AND_ROOT,
        "enabled": off("the performance tracer", False),
        "save_interval": inert("read only by an enabled tracer"),
        "profile_steps": inert("read only by an enabled tracer"),
        "session_tracer": section("AReaL's session tracer", {
            "enabled": off("the session tracer", False),
            "flush_threshold": inert("read only by an enabled session tracer"),
        }),
    }),
    "memory_profiler": off("the memory profiler", None),
    "teacher": section("on-policy distillation from a teacher: rlkit's job type distill", TEACHER),
    "beta": renamed("dpo.beta", "rlkit keeps DPO's settings in the dpo section"),
    "loss_type": renamed("dpo.loss_type", "rlkit keeps DPO's settings in the dpo section"),
}

GCONFIG: dict[str, Rule] = {
    "max_tokens": same("a cap on prompt + completion that no prompt reaches (train_dataset.max_length + "
                       "max_new_tokens) changes nothing", _max_tokens_never_binding,
                       fix="remove it and bound the parts: train_dataset.max_length and gconfig.max_new_tokens"),
    "stop_token_ids": off("extra stop tokens", None, [], fix="remove it (the model's EOS ends a completion; stop "
                                                              "strings: gconfig.stop)"),
    "ignore_eos": off("ignoring EOS", False),
    "skip_special_tokens": inert("rlkit works on token ids and decodes completions itself"),
    "frequency_penalty": off("the frequency penalty", 0),
    "lora_name": inert("rlkit names the servers' adapter itself (a new name per weight version)"),
    "use_beam_search": off("beam search", False),
}

ROLLOUT: dict[str, Rule] = {
    **NAMES_AND_ROOT,
    "tokenizer_path": TOKENIZER,
    "backend": LAYOUT,
    "enable_rollout_tracing": inert("AReaL's rollout tracing"),
    "check_trajectory_format": inert("a debugging check of AReaL's custom workflows"),
    "schedule_policy": inert("rlkit's server pool picks servers itself (least loaded)"),
    "pause_grace_period": inert("rlkit pauses servers and waits for their answers by its own protocol"),
    "dump_to_file": inert("AReaL's debugging dump of generated rollouts"),
    "workers_ready_timeout": AREAL_RPC,
    "scheduling_spec": PLACEMENT,
    "scheduling_strategy": PLACEMENT,
    "admin_api_key": AREAL_RPC,
    "poll_interval": AREAL_RPC,
    "use_lora": same_value("actor.use_lora", lambda c: c.actor.use_lora,
                           why="rlkit serves LoRA adapters exactly when actor.use_lora"),
    "lora_name": inert("rlkit names the servers' adapter itself (a new name per weight version)"),
    "return_routed_experts": off("returning MoE routing", False),
    "model": inert("the model name of AReaL's inference-service gateway"),
    "routing_strategy": inert("AReaL's inference-service router; rlkit's pool routes itself"),
    "api_url": off("an external model API", None, ""),
    "provider_api_key": off("an external model API", None, ""),
}

def _is_one(value: object, c: ExperimentConfig) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1.0


# AReaL's agent keys that rlkit's `rollout.agent` (rlkit.config.schema.agent) lacks
AGENT: dict[str, Rule] = {
    "agent_cls_path": off("AReaL's AgentRunnable classes", "", fix="write the episode as an async function and name "
                                                                     "it in rollout.agent.workflow"),
    "mode": same("rlkit runs workflows in the rollout's own event loop (AReaL's inline mode)",
                 lambda v, c: v == "inline", fix="remove it (subproc and online modes are not supported yet)"),
    "reasoning_parser": inert("how AReaL's OpenAI proxy splits reasoning text off; rlkit keeps every sampled token"),
    "chat_template_type": inert("rlkit never renders a conversation again: it appends the sampled tokens and the "
                                "template's glue between turns (token-exact)"),
    "turn_discount": same("rlkit rewards an episode as a whole", _is_one,
                          fix="remove it (per-turn discounting is not supported yet)", expected=lambda c: 1.0),
    "export_style": same("rlkit trains each episode as one token-exact trajectory (AReaL's concat)",
                         lambda v, c: v == "concat", fix="remove it (training each interaction on its own is not "
                                                         "supported yet)", expected=lambda c: "concat"),
    "admin_api_key": AREAL_RPC,
    "scheduling_spec": PLACEMENT,
    "subproc_max_workers": inert("AReaL's subprocess mode"),
    "session_timeout_seconds": inert("AReaL's online mode sessions"),
    "set_reward_finish_timeout": inert("AReaL's online mode sessions"),
}

DATASET: dict[str, Rule] = {
    "pin_memory": WORKERS,
    "num_workers": WORKERS,
    "num_dataset_workers": WORKERS,
    "drop_last": same("rlkit drops the last partial batch of an epoch", lambda v, c: v is True,
                      fix="remove it (keeping a partial batch is not supported yet)", expected=lambda c: True),
    "dataset_kwargs": off("extra dataset-loader arguments", None, {}),
    "scheduling_spec": PLACEMENT,
    "setup_timeout": AREAL_RPC,
}
VALID_DATASET: dict[str, Rule] = {
    **DATASET,
    "drop_last": inert("rlkit evaluates on the valid rows, not in training batches"),
}

TRACKIO: dict[str, Rule] = {
    "mode": off("Trackio logging", "disabled", fix="remove the trackio section (Trackio is not supported yet; "
                "metrics.jsonl, TensorBoard, W&B and SwanLab are)"),
    **dict.fromkeys(("project", "name", "space_id"), inert("read only by enabled Trackio")),
}


def _wandb_off(value: object, c: ExperimentConfig) -> bool:
    return c.stats_logger.wandb.mode == "disabled"


WANDB: dict[str, Rule] = {
    **dict.fromkeys(("wandb_base_url", "wandb_api_key"), inert_if(
        "W&B is disabled", _wandb_off, refused="rlkit's W&B logger reads its server and key from the environment",
        fix="remove it and export WANDB_BASE_URL / WANDB_API_KEY for the job (launcher.trainer_env_vars or your "
            "shell): rlkit keeps secrets out of the config")),
    **dict.fromkeys(("job_type", "group", "notes", "tags", "config", "id_suffix"),
                    inert("run metadata rlkit does not send to W&B (the run's metrics are the same)")),
}

TABLES: dict[str, dict[str, Rule]] = {
    "": TOP,
    "actor": ACTOR,
    "critic": CRITIC,
    "ref": REF,
    "actor.mb_spec": MB_SPEC,
    "actor.fsdp": FSDP,
    "critic.fsdp": FSDP,
    "critic.mb_spec": MB_SPEC,
    "actor.optimizer": OPTIMIZER,
    "critic.optimizer": OPTIMIZER,
    "gconfig": GCONFIG,
    "eval_gconfig": GCONFIG,
    "rollout": ROLLOUT,
    "rollout.agent": AGENT,
    "train_dataset": DATASET,
    "valid_dataset": VALID_DATASET,
    "saver": {**NAMES_AND_ROOT, "mode": same("rlkit saves synchronously", lambda v, c: v in ("auto", "sync"),
                                              fix="remove it (asynchronous saving is not supported yet)")},
    "recover": {**NAMES_AND_ROOT, "no_save_optim": off("recover checkpoints without the optimizer", False),
                "no_load_optim": off("resuming without the optimizer", False)},
    "evaluator": {**NAMES_AND_ROOT, "eval_before_train": same_value(
        "evaluator.eval_on_startup", lambda c: c.evaluator.eval_on_startup)},
    "stats_logger": {**NAMES_AND_ROOT, "trackio": section("Trackio logging", TRACKIO)},
    "stats_logger.wandb": WANDB,
    "stats_logger.swanlab": {"config": inert("run metadata rlkit does not send to SwanLab")},
    "cluster.name_resolve": {"ray_actor_name": inert("Ray's key-value store; rlkit runs without Ray")},
    "vllm": VLLM,
    "sglang": SGLANG,
}

# AReaL sections rlkit has under another name: refused with the rename (moving keys is the user's one edit).
RENAMED_SECTIONS = {"model": "actor"}
