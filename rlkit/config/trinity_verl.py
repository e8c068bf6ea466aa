"""Trinity-RFT's embedded verl trainer config (`trainer.trainer_config`, verl's key names) for `rlkit migrate`
(rlkit.config.trinity): each key judged by what Trinity-RFT's own code does with it. They all fell to "left out (rlkit
has no such key)": a critic's learning rate, the actor's grad_clip and ppo_epochs of a Trinity-RFT run were dropped.

What Trinity-RFT does (its code decides, not verl's): trinity/common/verl_config.py (newer releases:
trinity/trainer/verl/verl_config.py), veRLConfig.synchronize_config, OVERWRITES a key from Trinity-RFT's own sections
(the actor's optimizer from algorithm.optimizer, every field, set or not; ppo_mini_batch_size from
buffer.train_batch_size, so one minibatch a step; the names, paths and GPU counts), FILLS a few only when the user left
them unset (set_if_none: the actor's grad_clip, use_dynamic_bsz, ulysses size and token budget from the trainer
section, so trainer_config's value wins) and leaves the rest as written. Its actor computes the loss with Trinity-RFT's
own functions (trinity/trainer/verl/dp_actor.py, DataParallelPPOActor.set_algorithm and update_policy:
algorithm.policy_loss_fn, kl_loss_fn, entropy_loss_fn and algorithm.loss_agg_mode), so verl's clip_ratio*,
entropy_coeff, loss_agg_mode and kl_loss_* are NOT READ; its explorer generates, scores and evaluates, so verl's
rollout, data and reward sections are not read either (trinity/trainer/verl/verl_trainer.py, VerlPPOTrainerWrapper).
The keys Trinity-RFT reads as verl does go through verl's key map (rlkit.config.verl.rules.verl_row), the critic's
optimizer through verl's optimizer reading (rlkit.config.verl.learning.optimizer) with Trinity-RFT's defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlkit.config.problems import Problems
from rlkit.config.trinity_knobs import NOT_BUILT as TRINITY_NOT_BUILT
from rlkit.config.trinity_terms import TRINITY_DEFAULT_TYPE
from rlkit.config.verl.learning import NOT_BUILT as VERL_NOT_BUILT
from rlkit.config.verl.learning import optimizer, unknown_changes_learning
from rlkit.config.verl.mapping import RunMapping
from rlkit.config.verl.rules import verl_row

PREFIX = "trainer.trainer_config."
ARR = "actor_rollout_ref"
ACTOR, ROLLOUT, MODEL, OPTIM = f"{ARR}.actor", f"{ARR}.rollout", f"{ARR}.model", f"{ARR}.actor.optim"
TRINITY_OPTIM_LR = 1e-6  # Trinity-RFT's veRLConfig Optim default (verl's critic default is 1e-5)
_ONE_STEP = "buffer.train_batch_size: one minibatch a step"
# algorithm.optimizer's fields (OptimizerConfig): synchronize_config copies each over the actor's optim
_OPTIMIZER_FIELDS = ("lr", "lr_warmup_steps", "lr_warmup_steps_ratio", "min_lr_ratio", "warmup_style",
                     "lr_scheduler_type", "betas", "weight_decay", "clip_grad")
_RESPONSE_ONLY = "Trinity-RFT's explorer scores the rollouts with the taskset's reward function"

# verl key (or section, ending in ".") -> the Trinity-RFT key synchronize_config overwrites it from
OVERWRITTEN: dict[str, str] = {
    "trainer.nnodes": "cluster.node_num", "trainer.n_gpus_per_node": "cluster.gpu_per_node",
    "trainer.total_training_steps": "trainer.total_steps", "trainer.sync_freq": "synchronizer.sync_interval",
    "trainer.save_freq": "trainer.save_interval", "trainer.project_name": "project", "trainer.group_name": "group",
    "trainer.experiment_name": "name", "trainer.default_local_dir": "checkpoint_root_dir",
    "trainer.resume_mode": "continue_from_checkpoint", "data.train_batch_size": "buffer.train_batch_size",
    "data.trust_remote_code": "model.trust_remote_code", f"{ARR}.nccl_timeout": "synchronizer.sync_timeout",
    f"{ARR}.synchronizer.": "the synchronizer section", "synchronizer.": "the synchronizer section",
    f"{ARR}.explorer_name": "explorer.name", "enable_preview": "trainer.enable_preview",
    f"{MODEL}.path": "model.model_path", f"{MODEL}.trust_remote_code": "model.trust_remote_code",
    f"{MODEL}.custom_chat_template": "model.custom_chat_template", f"{MODEL}.rope_scaling": "model.rope_scaling",
    f"{MODEL}.rope_theta": "model.rope_theta",
    f"{ACTOR}.ppo_mini_batch_size": _ONE_STEP,
    f"{ACTOR}.use_kl_loss": "algorithm.kl_loss_fn (none: off)",
    f"{OPTIM}.total_training_steps": "trainer.total_steps", f"{OPTIM}.optimizer": "algorithm.optimizer.optimizer_type",
    **{f"{OPTIM}.{name}": f"algorithm.optimizer.{name}" for name in _OPTIMIZER_FIELDS},
    f"{ROLLOUT}.temperature": "buffer.explorer_input.taskset.rollout_args.temperature",
    f"{ROLLOUT}.n": "algorithm.repeat_times", "algorithm.use_kl_in_reward": "algorithm.kl_penalty_fn (none: off)",
    "critic.enable": "algorithm.algorithm_type (ppo trains a critic)",
    "critic.nccl_timeout": "synchronizer.sync_timeout",
    "critic.ray_namespace": "synchronizer.ray_namespace", "critic.model.path": "model.critic_model_path",
    "critic.model.tokenizer_path": "model.critic_model_path", "critic.model.rope_scaling": "model.rope_scaling",
    "critic.model.rope_theta": "model.rope_theta",
    "critic.ppo_mini_batch_size": _ONE_STEP,
    "critic.rollout_n": "algorithm.repeat_times", "critic.optim.total_training_steps": "trainer.total_steps",
}
# verl key (or section) Trinity-RFT's trainer does not read -> the Trinity-RFT key that holds its meaning
NOT_READ: dict[str, str] = {
    f"{ACTOR}.clip_ratio": "algorithm.policy_loss_fn_args.clip_range",
    f"{ACTOR}.clip_ratio_low": "algorithm.policy_loss_fn_args.clip_range_low",
    f"{ACTOR}.clip_ratio_high": "algorithm.policy_loss_fn_args.clip_range_high",
    f"{ACTOR}.clip_ratio_c": "algorithm.policy_loss_fn_args.clip_ratio_c",
    f"{ACTOR}.policy_loss.": "algorithm.policy_loss_fn",
    f"{ACTOR}.entropy_coeff": "algorithm.entropy_loss_fn_args.entropy_coef",
    f"{ACTOR}.loss_agg_mode": "algorithm.loss_agg_mode", f"{ACTOR}.loss_scale_factor": "algorithm.loss_agg_mode",
    f"{ACTOR}.kl_loss_coef": "algorithm.kl_loss_fn_args.kl_coef", f"{ACTOR}.kl_loss_type": "algorithm.kl_loss_fn",
    "algorithm.gamma": "algorithm.advantage_fn_args.gamma", "algorithm.lam": "algorithm.advantage_fn_args.lam",
    "algorithm.adv_estimator": "algorithm.advantage_fn", "algorithm.norm_adv_by_std_in_grpo": "algorithm.advantage_fn",
    "algorithm.kl_penalty": "algorithm.kl_penalty_fn", "algorithm.kl_ctrl.": "algorithm.kl_penalty_fn_args",
    f"{ROLLOUT}.": "explorer.rollout_model and the taskset's rollout_args (Trinity-RFT's explorer generates)",
    "data.": "buffer.explorer_input (Trinity-RFT builds no verl dataloader: VerlPPOTrainerWrapper._create_dataloader)",
    "reward_model.": _RESPONSE_ONLY, "reward.": _RESPONSE_ONLY, "custom_reward_function.": _RESPONSE_ONLY,
    "trainer.total_epochs": "buffer.total_epochs", "trainer.logger": "monitor.monitor_type",
    "trainer.test_freq": "explorer.eval_interval", "trainer.val_before_train": "explorer.eval_on_startup",
    "trainer.resume_from_path": "continue_from_checkpoint (resume_mode is auto or disable)",
}
# verl's policy_loss.loss_mode -> Trinity-RFT's policy_loss_fn of the same loss (rlkit.config.verl.policy_loss reads
# verl's own runs; under Trinity-RFT verl's loss_mode is not read whatever it names)
TRINITY_LOSS_OF = {"vanilla": "ppo", "cispo": "cispo", "gspo": "gspo", "sapo": "sapo",
                   "gpg": "ppo with policy_loss_fn_args.fallback_to_policy_gradient true"}
# (verl key, Trinity-RFT's trainer key): synchronize_config fills the first from the second only when it is unset
PRECEDENCE = ((f"{ACTOR}.grad_clip", "trainer.grad_clip"), (f"{ACTOR}.use_dynamic_bsz", "trainer.use_dynamic_bsz"),
              (f"{ACTOR}.ppo_max_token_len_per_gpu", "trainer.max_token_len_per_gpu"),
              (f"{ACTOR}.ulysses_sequence_parallel_size", "trainer.ulysses_sequence_parallel_size"),
              (f"{ACTOR}.fix_actor_microbatch_loss_scale", "trainer.fix_actor_microbatch_loss_scale"),
              (f"{ACTOR}.strategy", "trainer.trainer_strategy"))
_MEGATRON = "Megatron's optimizer knob, read with trainer_strategy megatron only: rlkit's trainer is FSDP"
# key (or section) -> why it changes nothing learned, for the keys of Trinity-RFT's verl config verl's key map lacks
INFRA: dict[str, str] = {
    f"{ACTOR}.fix_actor_microbatch_loss_scale": "how micro-batches weigh in a token-mean: rlkit's token-mean is "
                                                "over the whole minibatch, what true gives",
    f"{ACTOR}.shuffle": "one minibatch a step: nothing to shuffle", "critic.shuffle": "one minibatch a step",
    f"{ACTOR}.calculate_sum_pi_squared": "a quantity of verl's optimal_token_baseline, which Trinity-RFT's "
                                         "advantage functions do not read",
    f"{ACTOR}.sum_pi_squared_checkpointing": "memory of a quantity nothing reads",
    f"{ACTOR}.data_loader_seed": "verl's minibatch shuffling seed (one minibatch a step)",
    "critic.data_loader_seed": "verl's minibatch shuffling seed (one minibatch a step)",
    f"{ACTOR}.load_weight": "verl's worker loads the model's weights (true)", "critic.load_weight": "as the actor's",
    f"{ACTOR}.profile.": "verl's profiler", "critic.profile.": "verl's profiler",
    f"{ACTOR}.fsdp_config.": "FSDP's sharding, offload and precision: rlkit's FSDP trainer has its own (actor.dtype)",
    "critic.model.fsdp_config.": "FSDP's sharding, offload and precision: rlkit's FSDP trainer has its own",
    "critic.checkpoint.": "what verl's checkpoints hold", "critic.megatron.": "Megatron's parallelism and offload",
    "critic.strategy": "fsdp or fsdp2: rlkit's trainer is FSDP", "critic.ppo_micro_batch_size": "memory: micro-batches",
    "critic.forward_micro_batch_size": "memory: micro-batches", "critic.model.external_lib": "a module verl imports",
    f"{MODEL}.external_lib": "a module verl imports to register a model class",
    f"{MODEL}.enable_activation_offload": "memory: activations offloaded", f"{ARR}.ref.": "the reference model's "
    "forwards: rlkit's reference uses the actor's micro-batches and sharding",
    "global_profiler.": "verl's profiler",
    **{f"{section}.{name}": _MEGATRON for section in (OPTIM, "critic.optim") for name in (
        "weight_decay_incr_style", "lr_wsd_decay_style", "lr_wsd_decay_steps", "use_checkpoint_opt_param_scheduler")},
    "trainer.": "verl's trainer bookkeeping (saving, logging, devices): rlkit's saver, recover and stats_logger",
}
# keys Trinity-RFT keeps as written whose value rlkit has only at the default: (default, why left out there)
KEPT: dict[str, tuple[Any, str]] = {
    f"{OPTIM}.optimizer_impl": ("torch.optim", "torch's AdamW, as rlkit's"),
    f"{OPTIM}.num_cycles": (0.5, "cosine's half cycle, as rlkit's"),
}
# the critic's optimizer keys verl's key map names for the actor only
CRITIC_OPTIM = {"critic.optim.min_lr_ratio": "critic.optimizer.min_lr_ratio",
                "critic.optim.warmup_style": "critic.optimizer.lr_scheduler_type"}
_SCHEDULE = ("lr_warmup_init", "lr_decay_steps", "lr_decay_style", "min_lr")
_LORA = tuple(f"{MODEL}.{name}" for name in ("lora_rank", "lora_alpha", "target_modules", "exclude_modules",
                                             "lora_adapter_path"))

Fate = Callable[[str, Any, str], None]  # (Trinity-RFT key, its value, what became of it)
Put = Callable[[str, Any], None]
Left = Callable[[str, str], None]


class _Embedded(RunMapping):
    """verl's reading of the embedded keys (names without PREFIX), its problems naming the key as the file writes it."""

    def refuse(self, key: str, why: str, hint: str, unless: str = "") -> None:
        self.done.add(key)
        self.problems.add(f"{PREFIX}{key} {self.leaves.get(key)!r} ({self.source}): {why}", hint=hint)


def _match(table: dict[str, str], key: str) -> str | None:
    return next((what for name, what in table.items()
                 if key == name or (name.endswith(".") and key.startswith(name))), None)


def embedded_verl(leaves: dict[str, Any], fate: Fate, put: Put, left: Left, problems: Problems, source: str,
                  rl: bool) -> set[str]:
    """Judge every key under trainer.trainer_config (and the Trinity-RFT keys its values win over); `rl`: a run with
    rollouts (not sft/dpo), whose actor Trinity-RFT trains one minibatch a step. Returns the keys judged here."""
    sub = {key.removeprefix(PREFIX): value for key, value in leaves.items() if key.startswith(PREFIX)}
    ppo = leaves.get("algorithm.algorithm_type", TRINITY_DEFAULT_TYPE) == "ppo"
    m = _Embedded(sub, source, ())
    m.problems, m.whose, m.critic = problems, "Trinity-RFT's", ppo
    judged = _precedence(m, leaves, left, problems, source)
    _lora(m, leaves)
    _rollout_correction(m, rl)
    if rl:
        _one_minibatch(m, "actor", f"{ACTOR}.ppo_mini_batch_size")
    if ppo:
        _critic(m, leaves)
    for key, value in sub.items():
        if key not in m.done:
            _judge(m, key, value, leaves, ppo)
    for item in m.fates:
        fate(PREFIX + item.key, item.value, item.fate)
    for to, value in _flat(m.out):
        put(to, value)
    return judged | {PREFIX + key for key in sub}


def _judge(m: _Embedded, key: str, value: Any, leaves: dict[str, Any], ppo: bool) -> None:
    """One key the readings above left: overwritten, not read, moved by verl's key map, infrastructure, or unknown."""
    overwritten, not_read, row = _match(OVERWRITTEN, key), _match(NOT_READ, key), verl_row(key)
    refused = next(((why, fix) for name, defaults, why, fix in VERL_NOT_BUILT if name == key and value not in
                    defaults), None)
    if overwritten:
        m.left(key, f"Trinity-RFT overwrites it from {overwritten}")
    elif not_read:
        same = TRINITY_LOSS_OF.get(value) if key == f"{ACTOR}.policy_loss.loss_mode" and isinstance(value, str) \
            else None
        m.left(key, f"not read: Trinity-RFT's trainer takes it from {not_read}" + (f" (verl's {value} is its {same})"
                                                                                   if same else ""))
    elif key.startswith("critic.") and not ppo:
        m.left(key, "only algorithm_type ppo trains a critic (Trinity-RFT sets critic.enable from it)")
    elif refused:
        m.refuse(key, *refused)
    elif key.startswith((f"{MODEL}.override_config.", "critic.model.override_config.")):
        m.refuse(key, "overrides of the model's config.json: rlkit loads the model as its config.json says",
                 "write them into a copy of the model directory's config.json and give that path")
    elif key.startswith((f"{OPTIM}.", "critic.optim.")) and key.split(".")[-1] in _SCHEDULE:
        _megatron_schedule(m, key, value)
    elif key in KEPT:
        default, why = KEPT[key]
        if value in (default, None):
            m.left(key, why)
        else:
            m.refuse(key, "not built in rlkit", f"use {default}, Trinity-RFT's default")
    elif key == "trainer.critic_warmup" and ppo and value:
        m.refuse(key, "the actor waits these steps while the critic trains: not built", "set it 0")
    elif key == "trainer.max_actor_ckpt_to_keep" and leaves.get("trainer.max_checkpoints_to_keep") is not None:
        m.left(key, "Trinity-RFT overwrites it from trainer.max_checkpoints_to_keep")
    elif key in CRITIC_OPTIM and value is not None:
        m.moved(key, CRITIC_OPTIM[key], value)
    elif row and not key.startswith("algorithm."):  # algorithm's other keys are not Trinity-RFT's: refused below
        if row[0] and value is not None and key != f"{ACTOR}.ppo_micro_batch_size_per_gpu":  # a size, not n_mbs
            m.moved(key, row[0], value)
        else:
            m.left(key, row[1] or "null: rlkit's default")
    elif _match(INFRA, key):
        m.left(key, _match(INFRA, key) or "")
    elif unknown_changes_learning(key, ppo):
        m.refuse(key, "not a key of Trinity-RFT's verl config rlkit knows, in a section whose keys change what "
                      "the run learns", "remove it if it holds the default; otherwise check its spelling, or set "
                                        "the rlkit key it means yourself (rlkit explain KEY)")
    else:
        m.left(key, "unknown: not a key of Trinity-RFT's verl config rlkit knows; check its spelling")


def _flat(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        out += _flat(value, f"{prefix}{key}.") if isinstance(value, dict) and value else [(f"{prefix}{key}", value)]
    return out


def _precedence(m: _Embedded, leaves: dict[str, Any], left: Left, problems: Problems, source: str) -> set[str]:
    """The actor keys synchronize_config fills from the trainer section only when unset: set here, they win."""
    judged: set[str] = set()
    for key, theirs in PRECEDENCE:
        if key not in m.leaves:
            continue
        if m.leaves[key] is None:
            m.left(key, f"null: Trinity-RFT fills it from {theirs}")
            continue
        if theirs in leaves:
            left(theirs, f"{PREFIX}{key} is set and wins (Trinity-RFT's synchronize_config fills it from "
                         f"{theirs} only when unset)")
            judged.add(theirs)
    clip, grad = "algorithm.optimizer.clip_grad", m.leaves.get(f"{ACTOR}.grad_clip")
    if grad is not None and clip in leaves:  # Trinity-RFT copies clip_grad to the optim; verl's actor reads grad_clip
        judged.add(clip)
        if leaves[clip] != grad:
            problems.add(f"{clip} {leaves[clip]!r} and {PREFIX}{ACTOR}.grad_clip {grad!r} ({source}) disagree",
                         hint="keep one (rlkit's actor.optimizer.gradient_clipping)")
        else:
            left(clip, f"the same as {PREFIX}{ACTOR}.grad_clip, moved")
    return judged


def _lora(m: _Embedded, leaves: dict[str, Any]) -> None:
    """The verl model's LoRA keys: model.lora_configs' adapter overwrites them; without it, an adapter only the trainer
    knows of (Trinity-RFT's explorer serves model.lora_configs) is refused."""
    keys = [key for key in _LORA if key in m.leaves]
    rank = m.leaves.get(f"{MODEL}.lora_rank") or 0
    for key in keys:
        if leaves.get("model.lora_configs"):
            m.left(key, "Trinity-RFT overwrites it from model.lora_configs")
        elif key == f"{MODEL}.lora_rank" and rank:
            m.refuse(key, "a LoRA adapter only the trainer knows of: Trinity-RFT's explorer serves the adapter of "
                          "model.lora_configs", "give the adapter as model.lora_configs (rlkit's actor.use_lora)")
        elif not rank:
            m.left(key, "LoRA is off (lora_rank 0)")
        else:
            m.left(key, "with lora_rank, refused")


def _rollout_correction(m: _Embedded, rl: bool) -> None:
    """algorithm.rollout_correction, which VerlPPOTrainerWrapper.train_step reads: bypass_mode (Trinity-RFT's default
    true) takes the servers' log-probs as the old policy; rollout_is and rollout_rs reweight or drop tokens.

    Trinity-RFT's RolloutCorrection dataclass (trinity/common/verl_config.py; newer: _RolloutCorrectionConfig in
    trinity/trainer/verl/verl_config.py) sets bypass_mode: true, and synchronize_config leaves it as written. train_step
    (trinity/trainer/verl/verl_trainer.py) then sets old_log_probs to the batch's rollout_log_probs (verl's
    apply_bypass_mode) instead of _compute_old_log_prob, whatever the algorithm_type; to_data_proto
    (trinity/trainer/verl/utils.py) puts the experiences' logprobs there for every batch with rewards, which an RL
    run's are (sft's and dpo's have none: nothing to bypass). So an RL file that leaves it unset trains against the
    servers' log-probs: rlkit's actor.recompute_logprob false, written and said here, not rlkit's default true."""
    prefix = "algorithm.rollout_correction."
    switches = [(key.removeprefix(PREFIX), defaults, why, fix) for key, defaults, why, fix in VERL_NOT_BUILT
                if key.startswith(prefix)]
    for key, defaults, why, fix in switches:
        if key in m.leaves and m.leaves[key] not in defaults:
            m.refuse(key, why, fix)
        elif key in m.leaves:
            m.left(key, f"{m.leaves[key]}: off")
    bypass = f"{prefix}bypass_mode"
    if bypass in m.leaves and not isinstance(m.leaves[bypass], bool):
        m.refuse(bypass, "not true or false", "true (Trinity-RFT's default: the servers' log-probs are the old "
                                              "policy's) or false (the trainer recomputes them)")
    elif not rl and bypass in m.leaves:
        m.left(bypass, "sft and dpo have no rollouts' log-probs to take")
    elif bypass in m.leaves:
        recompute = not m.leaves[bypass]
        m.moved(bypass, "actor.recompute_logprob", recompute, f" {str(recompute).lower()}" + (
            " (the trainer recomputes the old policy's log-probs)" if recompute else
            " (the servers' log-probs are the old policy's)"))
    elif rl:
        m.out.setdefault("actor", {})["recompute_logprob"] = False
        m.fate(bypass, "moved to actor.recompute_logprob as false, Trinity-RFT's default bypass_mode true: the "
                       "servers' log-probs are the old policy's, not recomputed (set bypass_mode false to recompute)")
    off = all(m.leaves.get(key) in defaults for key, defaults, _, _ in switches)
    for key in [k for k in m.leaves if k.startswith(prefix) and k not in m.done]:
        if off:
            m.left(key, "rollout_is and rollout_rs off: not read")
        else:
            m.done.add(key)  # its switch is refused, naming the fix


def _one_minibatch(m: _Embedded, ours: str, key: str) -> None:
    """synchronize_config sets ppo_mini_batch_size to buffer.train_batch_size: one optimizer step a pass."""
    m.out.setdefault(ours, {})["ppo_n_minibatches"] = 1
    if key in m.leaves:
        m.left(key, f"Trinity-RFT overwrites it from {_ONE_STEP}, written as {ours}.ppo_n_minibatches 1")
    else:
        m.fate(key, f"moved to {ours}.ppo_n_minibatches as 1: Trinity-RFT sets it to {_ONE_STEP}")


def _critic(m: _Embedded, leaves: dict[str, Any]) -> None:
    """ppo's critic: its optimizer as verl reads it with Trinity-RFT's defaults (veRLConfig's Optim, lr 1e-6), one
    minibatch a step, its value clip (Trinity-RFT's cliprange_value 0.0), epochs and grad clip where unset."""
    kind = "critic.optim.optimizer"
    if kind in m.leaves:
        if str(m.leaves[kind]).lower() in ("adam", "adamw"):
            m.left(kind, "adam and adamw are AdamW in Trinity-RFT's FSDP trainer, as rlkit's adam")
        else:
            m.refuse(kind, "not built in rlkit", "use adamw")
        m.leaves = {k: v for k, v in m.leaves.items() if k != kind}  # judged: verl's reading would name it again
    total = leaves.get("trainer.total_steps") or leaves.get("buffer.total_steps")
    if total is not None:  # the total lr_warmup_steps is a fraction of: Trinity-RFT overwrites verl's
        m.leaves = {**m.leaves, "trainer.total_training_steps": total}
    optimizer(m, "critic.optim", "critic.optimizer", TRINITY_OPTIM_LR)
    if "critic.optim.clip_grad" not in m.leaves and "critic.grad_clip" not in m.leaves:
        value = leaves.get("trainer.grad_clip", 1.0)
        m.out.setdefault("critic", {}).setdefault("optimizer", {})["gradient_clipping"] = value
        m.fate("critic.grad_clip", f"moved to critic.optimizer.gradient_clipping as {value}: Trinity-RFT fills it "
                                   "from trainer.grad_clip")
    _one_minibatch(m, "critic", "critic.ppo_mini_batch_size")
    epochs = "critic.ppo_epochs"
    if m.leaves.get(epochs) is not None:
        m.moved(epochs, epochs, m.leaves[epochs])
    else:  # verl's critic does not take the actor's: Trinity-RFT's Critic dataclass default
        m.out.setdefault("critic", {})["ppo_epochs"] = 1
        m.fate(epochs, "moved to critic.ppo_epochs as 1, Trinity-RFT's default")
    clip = "critic.cliprange_value"
    value = m.leaves.get(clip)
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        m.moved(clip, "critic.eps_clip", value)
    elif clip in m.leaves and value is not None:
        m.refuse(clip, "rlkit's value clip is a range > 0 (0 keeps the larger of the new value's loss and the "
                       "rollout-time value's)", "set the clip range you mean, e.g. 0.5 (rlkit's critic.eps_clip)")
    else:  # unset: Trinity-RFT's 0.0, which rlkit does not take; said, not refused (every ppo file would be)
        m.left(clip, "Trinity-RFT's default 0.0 is no range rlkit's critic takes; rlkit's critic.eps_clip "
                     "0.5 clips the value loss instead (set critic.cliprange_value to choose)")
    agg = "critic.loss_agg_mode"
    if agg in m.leaves and m.leaves[agg] not in (None, "token-mean"):
        m.refuse(agg, "rlkit's value loss is a token-mean", "set it token-mean")
    elif agg in m.leaves:
        m.left(agg, "token-mean: rlkit's value loss")


def _megatron_schedule(m: _Embedded, key: str, value: Any) -> None:
    """lr_warmup_init, lr_decay_steps, lr_decay_style, min_lr: Megatron's schedule; judged as algorithm.optimizer's
    of the same name (rlkit.config.trinity_knobs)."""
    default, why, fix = TRINITY_NOT_BUILT[f"algorithm.optimizer.{key.split('.')[-1]}"]
    if value in (default, None):
        m.left(key, f"{value!r}: Trinity-RFT's default, nothing to carry")
    else:
        m.refuse(key, why, fix)
