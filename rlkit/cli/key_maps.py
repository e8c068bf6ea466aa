"""The common knobs of the other systems rlkit's users come from (verl, Trinity-RFT, cosmos-rl, ChatLearn, TRL), each
mapped to rlkit's key, or with why rlkit has none. Kept as data: a unit test holds every rlkit key here to the schema
(a renamed field fails it), `rlkit explain` shows these names, and `rlkit docs generate` renders the "coming from"
pages from them. AReaL's names come from rlkit.config.areal (rlkit reads AReaL configs directly)."""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.cli.chatlearn_keys import CHATLEARN_KEYS
from rlkit.cli.trl_keys import TRL_KEYS
from rlkit.config.verl.keys import VERL_KEYS


@dataclass(frozen=True)
class KeyMap:
    """One of their keys: `ours` is rlkit's dotted key ("" when rlkit has none); `note` says how the two differ, or
    why rlkit has no such key."""

    their: str
    ours: str
    note: str = ""


def _m(their: str, ours: str, note: str = "") -> KeyMap:
    return KeyMap(their, ours, note)


VERL = tuple(_m(*row) for row in VERL_KEYS)
TRL = tuple(_m(*row) for row in TRL_KEYS)

TRINITY = (
    _m("project", "experiment_name"),
    _m("name", "trial_name"),
    _m("checkpoint_root_dir", "cluster.fileroot"),
    _m("continue_from_checkpoint", "recover.mode", "auto resumes when a valid checkpoint exists"),
    _m("mode", "", "both: rlkit runs the servers and the trainer of one job together; train with algorithm_type "
       "sft or dpo: rlkit's trainer-only sft and dpo jobs (allocation_mode fsdp:dN, every GPU), the servers' keys "
       "left out; train with an RL algorithm (from a stored experience buffer) is not built; explore alone is job "
       "type generate"),
    _m("algorithm.algorithm_type", "type", "unset: ppo, Trinity-RFT's default; "
       "grpo, ppo, opmd, dpo and sft are job types of rlkit; mix is grpo (or "
       "ppo, opmd) with expert_dataset and mix.mu; cispo and gspo are grpo with their policy_loss_fn; sapo, dapo, "
       "rloo, reinforceplusplus, topr, rec, ... are refused naming what differs"),
    _m("algorithm.policy_loss_fn", "actor.policy_loss", "unset: algorithm_type's; ppo: rlkit's PPO clip; cispo: "
       "cispo (clip_range_low/high as eps_clip/eps_clip_higher, defaults 1.0/0.28); gspo: "
       "actor.importance_sampling_level sequence with loss_agg_mode seq-mean-token-mean (defaults 0.0003/0.0004); "
       "sapo (its gate taken as a constant: another gradient), topr, rec, m2po, ... refused"),
    _m("algorithm.policy_loss_fn_args.clip_ratio_c", "actor.c_clip", "ppo's dual clip; its "
       "fallback_to_policy_gradient: true (the ratio made 1) is actor.policy_loss gpg"),
    _m("algorithm.repeat_times", "gconfig.n_samples"),
    _m("algorithm.optimizer.lr", "actor.optimizer.lr", "unset: Trinity-RFT's 1e-6 (and its weight_decay 0.01, "
       "betas (0.9, 0.999), no warmup, torch's eps 1e-8) is written, rlkit's defaults differing"),
    _m("algorithm.optimizer.lr_scheduler_type", "actor.optimizer.lr_scheduler_type", "warmup_style, its older name, "
       "too"),
    _m("algorithm.optimizer.betas", "actor.optimizer.beta1", "two keys: actor.optimizer.beta1 and beta2"),
    _m("algorithm.optimizer.weight_decay", "actor.optimizer.weight_decay"),
    _m("algorithm.optimizer.lr_warmup_steps_ratio", "actor.optimizer.warmup_steps_proportion", "lr_warmup_steps "
       "(a count, which wins) becomes its fraction of buffer.total_steps"),
    _m("algorithm.optimizer.min_lr_ratio", "actor.optimizer.min_lr_ratio"),
    _m("algorithm.policy_loss_fn_args.clip_range", "actor.eps_clip", "clip_range_low is actor.eps_clip, "
       "clip_range_high actor.eps_clip_higher; each side defaults to clip_range, as in Trinity-RFT"),
    _m("algorithm.advantage_fn", "actor.reward_norm", "unset: algorithm_type's; grpo (of grpo, cispo, gspo, mix): "
       "reward_norm group mean and Bessel-corrected group std, eps advantage_fn_args.epsilon (1e-6); ppo's GAE and "
       "opmd's baseline are their job types' (ppo's advantage_fn_args gamma, lam: actor.discount, gae_lambda); "
       "another is refused"),
    _m("algorithm.advantage_fn_args.tau", "opmd.tau", "opmd; policy_loss_fn_args.tau too"),
    _m("algorithm.advantage_fn_args.opmd_baseline", "opmd.opmd_baseline"),
    _m("algorithm.policy_loss_fn_args.mu", "mix.mu", "mix: the weight of the expert rows' SFT loss"),
    _m("algorithm.policy_loss_fn_args.loss_agg_mode", "actor.loss_agg_mode", "verl's four names; with mix "
       "(expert_dataset) only token-mean"),
    _m("algorithm.sample_strategy_args.expert_data_ratio", "expert_dataset.batch_size", "ceil(ratio x "
       "buffer.batch_size x repeat_times) expert rows per step, read beside the RL batch (Trinity-RFT takes them "
       "out of it)"),
    _m("algorithm.kl_penalty_fn", "actor.kl_estimator", "k1, k2, k3 (low_var_kl: k3); kl_penalty_fn_args.kl_coef "
       "(default 0.001) is actor.kl_ctl; adaptive with target_kl and horizon is actor.kl_ctl_adaptive; abs and "
       "corrected_k3 are refused; read by Trinity-RFT's ppo only (its grpo, opmd and mix compute advantages "
       "outside the trainer and never apply it: left out there)"),
    _m("algorithm.kl_loss_fn", "actor.kl_loss_type", "k1, k2, k3 (low_var_kl: k3); kl_loss_fn_args.kl_coef "
       "(default 0.001) is actor.kl_loss_coef; unset or null: algorithm_type's default, k2 for ppo, grpo, opmd, "
       "cispo, gspo and mix (KL loss 0.001 x k2 against actor.path); abs, corrected_k3 and adaptive are refused"),
    _m("algorithm.entropy_loss_fn", "actor.entropy_coeff", "default and mix: entropy_loss_fn_args.entropy_coef "
       "(default 0) is actor.entropy_coeff; unset or null: algorithm_type's (default, mix for mix); none: off"),
    _m("algorithm.entropy_loss_fn_args.entropy_coef", "actor.entropy_coeff"),
    _m("monitor.monitor_type", "stats_logger.wandb.mode", "each sink has its own section under stats_logger"),
    _m("model.model_path", "actor.path"),
    _m("model.critic_model_path", "critic.path", "empty: actor.path, as in Trinity-RFT"),
    _m("model.max_model_len", "vllm.max_model_len", "sglang: sglang.context_length"),
    _m("model.max_response_tokens", "gconfig.max_new_tokens"),
    _m("model.min_response_tokens", "gconfig.min_new_tokens"),
    _m("model.max_prompt_tokens", "train_dataset.max_length", "rlkit drops longer prompts instead of truncating "
       "them"),
    _m("model.custom_chat_template", "sft.chat_template", "sft only"),
    _m("model.lora_configs", "actor.use_lora", "one adapter: actor.lora_rank, actor.lora_alpha, "
       "actor.target_modules"),
    _m("cluster.node_num", "cluster.n_nodes"),
    _m("cluster.gpu_per_node", "cluster.n_gpus_per_node"),
    _m("buffer.batch_size", "train_dataset.batch_size", "prompts per training step"),
    _m("buffer.total_epochs", "total_train_epochs"),
    _m("buffer.total_steps", "total_train_steps"),
    _m("buffer.explorer_input.taskset.path", "train_dataset.path"),
    _m("buffer.explorer_input.taskset.split", "train_dataset.split"),
    _m("buffer.explorer_input.taskset.format.prompt_key", "train_dataset.prompt_key"),
    _m("buffer.explorer_input.taskset.format.response_key", "reward.answer_key", "the truth the reward checks"),
    _m("buffer.explorer_input.taskset.rollout_args.temperature", "gconfig.temperature"),
    _m("buffer.explorer_input.taskset.rollout_args.top_p", "gconfig.top_p", "model.top_p (and temperature, "
       "top_k) when the taskset's rollout_args leave it unset"),
    _m("buffer.explorer_input.taskset.data_selector.selector_type", "train_dataset.shuffle", "sequential (its "
       "default): false; shuffle, random: true"),
    _m("algorithm.loss_agg_mode", "actor.loss_agg_mode"),
    _m("buffer.explorer_input.taskset.rollout_args.top_k", "gconfig.top_k"),
    _m("model.repetition_penalty", "", "rlkit's sampling has none: rlkit migrate refuses a value other than 1.0"),
    _m("buffer.explorer_input.eval_tasksets", "valid_dataset.path", "one evaluation set"),
    _m("buffer.explorer_input.default_reward_fn_type", "reward.fn", "accuracy_reward and math_boxed_reward are "
       "rlkit's math; the others have no built-in (several weighted: reward.fns)"),
    _m("buffer.trainer_input.auxiliary_buffers.sft_dataset.path", "expert_dataset.path", "mix's expert rows, in "
       "the sft section's row format"),
    _m("buffer.explorer_input.default_workflow_type", "rollout.agent.workflow", "empty: single-turn rollouts"),
    _m("buffer.trainer_input.experience_buffer.path", "train_dataset.path", "mode train (sft, dpo): the rows; "
       "storage_type file only"),
    _m("buffer.trainer_input.experience_buffer.split", "train_dataset.split", "mode train (sft, dpo)"),
    _m("buffer.train_batch_size", "train_dataset.batch_size", "mode train (sft, dpo): rows (dpo: pairs) per "
       "step; with servers it must be batch_size x repeat_times"),
    _m("buffer.trainer_input.experience_buffer.format.prompt_type", "sft.prompt_type", "unset: messages, "
       "Trinity-RFT's default (rlkit's is plaintext); dpo: messages only (Trinity-RFT sends plaintext pairs "
       "through the chat template, rlkit's dpo reads text as it stands)"),
    _m("buffer.trainer_input.experience_buffer.format.prompt_key", "sft.prompt_key", "dpo: refused (plaintext)"),
    _m("buffer.trainer_input.experience_buffer.format.system_prompt_key", "sft.system_prompt_key"),
    _m("buffer.trainer_input.experience_buffer.format.chat_template", "sft.chat_template", "unset: "
       "model.custom_chat_template; dpo has none"),
    _m("algorithm.policy_loss_fn_args.beta", "dpo.beta", "label_smoothing: dpo.label_smoothing"),
    _m("stages", "", "rlkit's own stages: each Trinity-RFT stage migrated as a whole file (a section it sets "
       "replaces the global one), its mode and algorithm_type giving its job type; each later stage starts from "
       "the stage before's final model"),
    _m("buffer.trainer_input.experience_buffer.format.response_key", "sft.response_key"),
    _m("buffer.trainer_input.experience_buffer.format.messages_key", "sft.messages_key", "unset: message, "
       "Trinity-RFT's default; dpo: train_dataset.prompt_key (the prompt's messages)"),
    _m("buffer.trainer_input.experience_buffer.format.system_prompt", "sft.system_prompt"),
    _m("buffer.trainer_input.experience_buffer.format.chosen_key", "dpo.chosen_key", "rw: rw.chosen_key"),
    _m("buffer.trainer_input.experience_buffer.format.rejected_key", "dpo.rejected_key", "rw: rw.rejected_key"),
    _m("buffer.trainer_input.experience_buffer.format.enable_concatenated_multi_turn",
       "sft.enable_concatenated_multi_turn"),
    _m("buffer.trainer_input.experience_buffer.format.tools_key", "sft.tools_key", "the same default (tools); None: "
       "'' (no tools column); dpo reads none"),
    _m("buffer.explorer_input.taskset.format.tools_key", "train_dataset.tools_key", "the same default (tools); "
       "None: '' (no tools column)"),
    _m("buffer.trainer_input.auxiliary_buffers.sft_dataset.format.tools_key", "sft.tools_key", "the expert rows of "
       "a mix, read as sft reads its rows; None: ''"),
    _m("explorer.rollout_model.engine_type", "allocation_mode", "the engine is the first part of allocation_mode"),
    _m("explorer.rollout_model.engine_num", "allocation_mode", "d of the server part, e.g. vllm:d4"),
    _m("explorer.rollout_model.tensor_parallel_size", "allocation_mode", "t of the server part, e.g. vllm:d2t2"),
    _m("explorer.auxiliary_models", "auxiliary_models", "the same entry keys, plus name and backend"),
    _m("explorer.eval_interval", "evaluator.freq_steps"),
    _m("explorer.eval_on_startup", "evaluator.eval_on_startup"),
    _m("synchronizer.sync_method", "actor.weight_update_mode", "nccl: xccl; checkpoint, memory: disk"),
    _m("synchronizer.sync_interval", "actor.weight_update_interval"),
    _m("synchronizer.sync_offset", "actor.weight_update_offset"),
    _m("synchronizer.sync_timeout", "actor.weight_update_timeout"),
    _m("synchronizer.sync_style", "", "fixed is what rlkit does; explorer_driven and trainer_driven are not built "
       "(rlkit migrate refuses them)"),
    _m("trainer.total_steps", "total_train_steps"),
    _m("trainer.save_interval", "saver.freq_steps", "Hugging Face models; recover checkpoints: recover.freq_steps"),
    _m("trainer.max_checkpoints_to_keep", "recover.keep_last"),
    _m("trainer.use_dynamic_bsz", "actor.mb_spec.packing", "Trinity-RFT's (verl's) splicing of shorter samples "
       "into token-budgeted batches: rlkit's packing, on by default, its budget actor.mb_spec.max_tokens_per_mb"),
    _m("trainer.grad_clip", "actor.optimizer.gradient_clipping"),
    _m("trainer.max_token_len_per_gpu", "actor.mb_spec.max_tokens_per_mb"),
    _m("trainer.ulysses_sequence_parallel_size", "actor.fsdp.ulysses_sp_size", "Ulysses over the packed rows of "
       "grpo, opmd, sft and ppo (ppo: set critic.fsdp.ulysses_sp_size alike)"),
    # the embedded verl trainer config (verl's names), as Trinity-RFT's code reads it (rlkit.config.trinity_verl)
    _m("trainer.trainer_config.actor_rollout_ref.actor.ppo_epochs", "actor.ppo_epochs", "the same minibatches "
       "each pass, as verl's; the keys Trinity-RFT reads as verl does move by verl's key map (coming from verl)"),
    _m("trainer.trainer_config.actor_rollout_ref.actor.grad_clip", "actor.optimizer.gradient_clipping", "wins over "
       "trainer.grad_clip, which Trinity-RFT fills it from only when unset; likewise ppo_max_token_len_per_gpu, "
       "use_dynamic_bsz and ulysses_sequence_parallel_size over the trainer section's"),
    _m("trainer.trainer_config.actor_rollout_ref.actor.ppo_mini_batch_size", "actor.ppo_n_minibatches",
       "Trinity-RFT overwrites it with buffer.train_batch_size: one minibatch a step, written as ppo_n_minibatches 1 "
       "(ppo's critic alike), the key set or not"),
    _m("trainer.trainer_config.actor_rollout_ref.actor.optim.lr", "", "Trinity-RFT overwrites the actor's optimizer "
       "from algorithm.optimizer (every field, set or not): set that"),
    _m("trainer.trainer_config.actor_rollout_ref.actor.clip_ratio_high", "", "not read: Trinity-RFT's actor computes "
       "its loss with algorithm.policy_loss_fn_args (clip_range_high); likewise clip_ratio, clip_ratio_low, "
       "entropy_coeff (entropy_loss_fn_args), loss_agg_mode (algorithm.loss_agg_mode), use_kl_loss and kl_loss_* "
       "(kl_loss_fn)"),
    _m("trainer.trainer_config.algorithm.gamma", "", "not read: Trinity-RFT's advantages come from "
       "algorithm.advantage_fn(_args) and its KL penalty from kl_penalty_fn; verl's rollout, data and reward sections "
       "are not read either (its explorer generates, scores and evaluates)"),
    _m("trainer.trainer_config.algorithm.rollout_correction.bypass_mode", "actor.recompute_logprob", "its opposite: "
       "true takes the servers' log-probs as the old policy's. Unset: Trinity-RFT's default true, written as "
       "actor.recompute_logprob false for every RL algorithm (said in the header; rlkit's default recomputes them), "
       "so rlkit's decoupled loss (and M2PO) is refused beside it unless bypass_mode is false; rollout_is and "
       "rollout_rs other than off are refused"),
    _m("trainer.trainer_config.critic.optim.lr", "critic.optimizer.lr", "ppo: the critic's optimizer as verl's key "
       "map reads it, Trinity-RFT's defaults where unset (lr 1e-6, betas (0.9, 0.999), weight_decay 0.01, the "
       "trainer's grad_clip)"),
    _m("trainer.trainer_config.critic.ppo_epochs", "critic.ppo_epochs", "unset: 1, Trinity-RFT's (not the actor's)"),
    _m("trainer.trainer_config.critic.cliprange_value", "critic.eps_clip", "a range > 0; unset, Trinity-RFT's 0.0 "
       "is no range rlkit takes: rlkit's 0.5 (said in the header)"),
    _m("trainer.trainer_config.actor_rollout_ref.model.lora_rank", "", "model.lora_configs overwrites it; without "
       "them, an adapter only the trainer knows of is refused: give it as model.lora_configs"),
)

COSMOS = (
    _m("mode", "", "rlkit always runs servers and trainer on GPUs of their own (disaggregated)"),
    _m("train.optm_lr", "actor.optimizer.lr"),
    _m("train.optm_weight_decay", "actor.optimizer.weight_decay"),
    _m("train.optm_betas", "actor.optimizer.beta1", "two keys: actor.optimizer.beta1 and beta2"),
    _m("train.optm_warmup_steps", "actor.optimizer.warmup_steps_proportion", "rlkit gives a fraction of the "
       "total steps"),
    _m("train.optm_decay_type", "actor.optimizer.lr_scheduler_type"),
    _m("train.optm_min_lr_factor", "actor.optimizer.min_lr_ratio"),
    _m("train.optm_grad_norm_clip", "actor.optimizer.gradient_clipping"),
    _m("train.param_dtype", "actor.dtype"),
    _m("train.epoch", "total_train_epochs"),
    _m("train.max_num_steps", "total_train_steps"),
    _m("train.output_dir", "cluster.fileroot"),
    _m("train.seed", "seed"),
    _m("train.resume", "recover.mode"),
    _m("train.ckpt.save_freq", "recover.freq_steps"),
    _m("train.ckpt.max_keep", "recover.keep_last"),
    _m("train.ckpt.export_safetensors", "saver.freq_steps", "rlkit saves Hugging Face models (safetensors) at "
       "the saver's triggers"),
    _m("train.train_policy.dataset.name", "train_dataset.path", "a local file or directory, or a hub id"),
    _m("train.train_policy.dataset.split", "train_dataset.split"),
    _m("train.train_policy.prompt_column_name", "train_dataset.prompt_key"),
    _m("train.train_policy.epsilon_low", "actor.eps_clip"),
    _m("train.train_policy.epsilon_high", "actor.eps_clip_higher"),
    _m("train.train_policy.kl_beta", "actor.kl_loss_coef"),
    _m("train.train_policy.loss_type", "actor.loss_agg_mode", "token-mean, seq-mean-token-mean and "
       "seq-mean-token-sum keep their names; seq-mean-token-mean with unbiased_loss_max_tokens set (Dr.GRPO) is "
       "seq-mean-token-sum-norm; rlkit has no token-sum"),
    _m("train.train_policy.unbiased_loss_max_tokens", "actor.loss_scale_factor", "with "
       "actor.loss_agg_mode=seq-mean-token-sum-norm"),
    _m("train.train_policy.mini_batch", "actor.ppo_n_minibatches", "cosmos-rl gives a size, rlkit a count"),
    _m("train.train_policy.max_token_len_per_mini_batch", "actor.mb_spec.max_tokens_per_mb"),
    _m("train.sequence_packing", "actor.mb_spec.packing", "cosmos-rl's default is false, rlkit's true; a model "
       "whose attention cannot take packed rows runs padded, said in the trainer log"),
    _m("train.train_policy.allowed_outdated_steps", "rollout.max_head_offpolicyness"),
    _m("train.train_policy.use_decoupled_loss", "actor.use_decoupled_loss"),
    _m("train.train_policy.behav_imp_weight_cap", "actor.behav_imp_weight_cap"),
    _m("train.train_policy.entropy_coeff", "actor.entropy_coeff"),
    _m("policy.model_name_or_path", "actor.path"),
    _m("policy.model_max_length", "vllm.max_model_len"),
    _m("policy.model_gradient_checkpointing", "actor.gradient_checkpointing"),
    _m("policy.parallelism.dp_shard_size", "allocation_mode", "d of the trainer part, e.g. fsdp:d8"),
    _m("policy.parallelism.tp_size", "", "rlkit's trainer shards with FSDP only (no tensor parallelism)"),
    _m("policy.lora.r", "actor.lora_rank", "and actor.use_lora: true"),
    _m("policy.lora.lora_alpha", "actor.lora_alpha"),
    _m("policy.lora.target_modules", "actor.target_modules"),
    _m("rollout.parallelism.tp_size", "allocation_mode", "t of the server part, e.g. vllm:d2t4"),
    _m("rollout.n_generation", "gconfig.n_samples"),
    _m("rollout.max_response_length", "gconfig.max_new_tokens"),
    _m("rollout.gpu_memory_utilization", "vllm.gpu_memory_utilization"),
    _m("rollout.enforce_eager", "vllm.enforce_eager"),
    _m("rollout.seed", "vllm.seed"),
    _m("rollout.sampling_config.temperature", "gconfig.temperature"),
    _m("rollout.sampling_config.top_p", "gconfig.top_p"),
    _m("rollout.sampling_config.top_k", "gconfig.top_k"),
    _m("logging.logger", "stats_logger.wandb.mode", "each sink has its own section under stats_logger"),
    _m("logging.project_name", "stats_logger.wandb.project"),
    _m("logging.experiment_name", "trial_name"),
    _m("validation.enable", "evaluator.freq_steps", "evaluation is on when a trigger is set"),
    _m("validation.freq", "evaluator.freq_steps"),
    _m("validation.val_before_train", "evaluator.eval_on_startup"),
    _m("validation.temperature", "eval_gconfig.temperature"),
    _m("validation.n_generation", "eval_gconfig.n_samples"),
    _m("validation.max_response_length", "eval_gconfig.max_new_tokens"),
)

CHATLEARN = tuple(_m(*row) for row in CHATLEARN_KEYS)

# {system: (its keys, the page's slug, what a user of it should know first)}
SEEDS: dict[str, tuple[tuple[KeyMap, ...], str, str]] = {
    "verl": (VERL, "verl", "verl describes a job as one Hydra config run by Ray on the nodes you give it; rlkit "
             "describes it as one YAML that becomes one Slurm job. verl's `actor_rollout_ref` splits into rlkit's "
             "`actor`, `ref` and the server sections (`vllm`, `sglang`), and the GPU split of trainer and servers "
             "is one string, `allocation_mode` (e.g. `vllm:d2t2+fsdp:d4`). `rlkit migrate run_grpo.sh` reads your run "
             "script (the key=value words of its `verl.trainer.main_ppo` command, read and never run: the "
             "variables the script sets before it, `kl_coef=0.0`, `NNODES=${NNODES:-16}`, "
             "`max_response_length=$((1024 * 8))`, an array of keys one a line `DATA=( ... )` passed as "
             "`\"${DATA[@]}\"`, are expanded as bash would and each listed in the header with "
             "its value and line, a `${NAME:-default}`'s default said to lose to a NAME set in verl's environment; "
             "`$HOME`, a `$(...)` and a variable set inside an if, loop or function stay as written, named in the "
             "header, and such a variable standing as a word of its own, whose keys would be lost, is refused) or a "
             "verl YAML file, and prints the rlkit config it becomes: each verl key moved, "
             "converted (a mini-batch size becomes a count, `low_var_kl` becomes `k3`, `adv_estimator` the job type), "
             "left out with the reason below, or refused with its fix. verl runs rollout and training on the same "
             "GPUs in turn; rlkit gives servers and trainer GPUs of their own, so migrate splits the run's GPUs "
             "about in half (the header says how; pass `allocation_mode=...` for another split).\n\n"
             "**Your data.** The Parquet files verl's preprocessing scripts write (`examples/data_preprocess/"
             "gsm8k.py`, `math_dataset.py`) are read as they are: each row's `prompt`, a list of chat messages, goes "
             "through the model's chat template with the generation prompt, as in verl, and `reward.answer_key: "
             "reward_model.ground_truth` reads the reference answer where verl's reward reads it (a dotted "
             "`answer_key` is a path through the row's nested fields; submit checks the first rows hold it). "
             "`rlkit migrate` writes that key and `reward.fn: math`, which scores GSM8K and MATH rows as verl's "
             "default scorer does, 1 or 0 for the final answer against the ground truth (it also credits a right "
             "answer written without GSM8K's `#### `, which verl's strict check scores 0). Other `data_source`s, "
             "and a `custom_reward_function`, need a `reward.fn` of your own: `fn(prompt, completion, row)`, the "
             "row holding `data_source`, `reward_model` and `extra_info`. rlkit trains text-only models: a "
             "vision-language run (`data.image_key`, `data.video_key`) is refused. rlkit drops a prompt longer than "
             "`data.max_prompt_length`: `data.truncation` left, right or middle is refused unless "
             "`data.filter_overlong_prompts=True` drops them in verl too. DAPO's overlong penalty "
             "(`reward_manager=dapo`, `reward_kwargs.overlong_buffer_cfg`) becomes `actor.overlong_*` with the same "
             "reward at every length.\n\n"
             "**A reward model.** `reward_model.enable=True` becomes `reward.fn: reward_model` (verl's training "
             "reward is then the model's score alone) with `reward_model.model.path` as `reward.reward_model_path` "
             "(a Hugging Face `*ForSequenceClassification` with one label, which reads the conversation through its "
             "own chat template, as verl's reward loop renders it). The model is scored on servers of its own: "
             "verl colocates them with the actor, rlkit cannot, so one server of "
             "`reward_model.rollout.tensor_model_parallel_size` GPUs is taken from the run's before the split "
             "(refused with the fix where the rest cannot hold a rollout server and a trainer); a pool of its own "
             "(`reward_model.enable_resource_pool`) becomes servers on nodes added to the run. A "
             "`custom_reward_function` beside the model is refused: pass `reward.fn` or a `reward.fns` mix "
             "(a weighted sum) that says which reward you mean."),
    "Trinity-RFT": (TRINITY, "trinity-rft", "Trinity-RFT's explorer, trainer and synchronizer are, in rlkit, the "
                    "servers, the trainer and the weight push of one Slurm job. Its buffer's row formats (prompt, "
                    "response, messages, chosen/rejected keys) keep their names in rlkit's `sft`, `rw` and `dpo` "
                    "sections. Its embedded verl config (`trainer.trainer_config`) is read as Trinity-RFT's code reads "
                    "it: a key Trinity-RFT overwrites from its own sections (the actor's optimizer from "
                    "`algorithm.optimizer`, `ppo_mini_batch_size` from `buffer.train_batch_size`, names, paths, GPU "
                    "counts) or does not read (verl's `clip_ratio*`, `entropy_coeff`, `loss_agg_mode`, `kl_loss_*`: "
                    "its actor's loss comes from the `algorithm` section) is left out naming the key that decides; "
                    "a key it reads as verl does moves by verl's key map; the actor's `grad_clip`, "
                    "`ppo_max_token_len_per_gpu`, `use_dynamic_bsz` and `ulysses_sequence_parallel_size` win over "
                    "the trainer section's; an unknown key under a learning section (the optimizers, `algorithm`) is "
                    "refused."),
    "cosmos-rl": (COSMOS, "cosmos-rl", "cosmos-rl's policy and rollout replicas are rlkit's trainer and servers; "
                  "their GPU counts and parallelism become `allocation_mode`. rlkit's trainer shards with FSDP only: "
                  "no tensor or pipeline parallelism in training; a long sequence splits over ranks by Ulysses "
                  "(actor.fsdp.ulysses_sp_size), not by cosmos-rl's context parallelism."),
    "ChatLearn": (CHATLEARN, "chatlearn", "ChatLearn's `runtime_args` are rlkit's top-level fields and datasets; its "
                  "`models.policy` is the servers and sampling, `models.policy_trainer` is `actor`. An episode is "
                  "one training step."),
    "TRL": (TRL, "trl", "TRL's GRPOTrainer runs generation and training in one process group (vLLM colocated or a "
            "`trl vllm-serve` server); rlkit runs its servers and trainer on GPUs of their own in one Slurm job, "
            "split by `allocation_mode`. There is no `rlkit migrate` for a TRL script: set the keys below. rlkit "
            "counts a step's batch in prompts (`train_dataset.batch_size`, each with `gconfig.n_samples` "
            "completions), split into `actor.ppo_n_minibatches` optimizer steps."),
}


def their_names(path: str) -> list[tuple[str, str, str]]:
    """[(system, their key, note)] of every key of the other systems that maps to rlkit's `path`."""
    return [(system, entry.their, entry.note) for system, (entries, _, _) in SEEDS.items() for entry in entries
            if entry.ours == path]


def render_key_maps() -> dict[str, str]:
    """{file relative to docs/: text} of the "coming from" page of each system."""
    from rlkit.cli.config_reference import GENERATED, cell, page_of

    pages = {}
    for system, (entries, slug, intro) in SEEDS.items():
        lines = [f"# Coming from {system}", "", GENERATED.replace("rlkit/config/schema", "rlkit/cli/key_maps.py"), "",
                 intro, "", f"Their common keys and rlkit's (`rlkit explain KEY` prints the {system} name too). "
                 "Where rlkit has no such key, the last column says why.", "",
                 f"| {system} | rlkit | Notes |", "|---|---|---|"]
        for entry in entries:
            ours = f"[`{entry.ours}`](../{page_of(entry.ours)})" if entry.ours else "—"
            lines.append(f"| `{entry.their}` | {ours} | {cell(entry.note)} |")
        pages[f"coming-from/{slug}.md"] = "\n".join(lines) + "\n"
    return pages


def unknown_keys(entries: tuple[KeyMap, ...]) -> list[str]:
    """The rlkit keys of `entries` that the schema does not have (a field renamed since the map was written)."""
    from rlkit.cli.schema_docs import schema_docs

    return [entry.ours for entry in entries if entry.ours and entry.ours not in schema_docs()]
