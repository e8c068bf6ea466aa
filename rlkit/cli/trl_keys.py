"""TRL's GRPO knobs (GRPOConfig and the transformers TrainingArguments it extends, as of TRL f2cd5771) and rlkit's:
the rows of the "coming from TRL" page and of `rlkit explain` (rlkit/cli/key_maps.py wraps them as its TRL table).
Each row is (TRL name, rlkit key or "" when rlkit has none, note: how the two differ, or why rlkit has none)."""

from __future__ import annotations

TRL_KEYS: tuple[tuple[str, str, str], ...] = (
    ("model", "actor.path", "GRPOTrainer's model argument: rlkit takes a Hugging Face model directory"),
    ("learning_rate", "actor.optimizer.lr", "TRL's GRPO default 1e-6, rlkit's 2e-5"),
    ("weight_decay", "actor.optimizer.weight_decay", "transformers' default 0, rlkit's 0.05"),
    ("adam_beta1", "actor.optimizer.beta1", ""),
    ("adam_beta2", "actor.optimizer.beta2", "transformers' default 0.999, rlkit's 0.95"),
    ("adam_epsilon", "actor.optimizer.eps", "transformers' default 1e-8, rlkit's 1e-5"),
    ("lr_scheduler_type", "actor.optimizer.lr_scheduler_type", "transformers' default linear, rlkit's constant"),
    ("warmup_ratio", "actor.optimizer.warmup_steps_proportion", ""),
    ("max_grad_norm", "actor.optimizer.gradient_clipping", ""),
    ("num_train_epochs", "total_train_epochs", ""),
    ("max_steps", "total_train_steps", "TRL counts optimizer steps, rlkit training steps (each "
     "actor.ppo_n_minibatches x actor.ppo_epochs optimizer steps)"),
    ("gradient_checkpointing", "actor.gradient_checkpointing", ""),
    ("disable_dropout", "actor.disable_dropout", ""),
    ("seed", "seed", ""),
    ("save_steps", "saver.freq_steps", "Hugging Face models; resume checkpoints: recover.freq_steps"),
    ("eval_steps", "evaluator.freq_steps", ""),
    ("report_to", "stats_logger.wandb.mode", "each sink has its own section under stats_logger"),
    ("per_device_train_batch_size", "train_dataset.batch_size", "TRL counts completions per device and "
     "micro-step; rlkit counts prompts per training step, each with gconfig.n_samples completions: "
     "generation_batch_size / num_generations"),
    ("generation_batch_size", "train_dataset.batch_size", "completions per generated batch; rlkit counts prompts: "
     "generation_batch_size / num_generations"),
    ("steps_per_generation", "actor.ppo_n_minibatches", "optimizer steps per generated batch: "
     "steps_per_generation / gradient_accumulation_steps (TRL's default: 1)"),
    ("gradient_accumulation_steps", "actor.mb_spec.n_mbs", "rlkit splits each minibatch into micro-batches by count "
     "or by tokens (actor.mb_spec.max_tokens_per_mb); the gradient is the minibatch's either way"),
    ("num_iterations", "actor.ppo_epochs", "TRL's mu: passes over each generated batch"),
    ("num_generations", "gconfig.n_samples", "and actor.group_size, its default"),
    ("max_completion_length", "gconfig.max_new_tokens", ""),
    ("temperature", "gconfig.temperature", ""),
    ("top_p", "gconfig.top_p", ""),
    ("top_k", "gconfig.top_k", "TRL's off is 0, rlkit's -1"),
    ("min_p", "", "rlkit's sampling has no min_p"),
    ("repetition_penalty", "", "rlkit's sampling has none"),
    ("shuffle_dataset", "train_dataset.shuffle", ""),
    ("use_vllm", "allocation_mode", "rlkit always samples with servers (vLLM or SGLang) on GPUs of their own: the "
     "server part of allocation_mode, e.g. vllm:d2+fsdp:d6; vllm_mode colocate is not built"),
    ("vllm_tensor_parallel_size", "allocation_mode", "t of the server part, e.g. vllm:d2t2"),
    ("vllm_gpu_memory_utilization", "vllm.gpu_memory_utilization", "sglang: sglang.mem_fraction_static"),
    ("vllm_max_model_length", "vllm.max_model_len", ""),
    ("reward_weights", "reward.fns", "{function: weight}: the reward is the weighted sum (TRL's "
     "multi_objective_aggregation sum_then_normalize)"),
    ("scale_rewards", "actor.reward_norm", "group (default): {mean_level: group, std_level: group, eps: 1e-4}; none: "
     "std_level null (Dr. GRPO); batch: std_level batch, which rlkit takes around the group means, TRL around the "
     "batch mean"),
    ("beta", "actor.kl_loss_coef", "TRL's KL term is k3 with gradient (actor.kl_loss_type k3, rlkit's default); "
     "> 0 loads the reference model in both"),
    ("epsilon", "actor.eps_clip", ""),
    ("epsilon_high", "actor.eps_clip_higher", "loss_type cispo: TRL caps the ratio itself at epsilon_high with no "
     "floor, rlkit clips it to [1 - eps_clip, 1 + eps_clip_higher]: eps_clip 1 and eps_clip_higher epsilon_high - 1"),
    ("delta", "actor.c_clip", "INTELLECT-2's two-sided clip caps the ratio of negative-advantage tokens at delta: "
     "the dual clip, with delta above 1 + epsilon_high as TRL recommends"),
    ("importance_sampling_level", "actor.importance_sampling_level", "sequence: GSPO"),
    ("loss_type", "actor.loss_agg_mode", "dapo (TRL's default) and bnpo: token-mean; grpo: seq-mean-token-mean; "
     "dr_grpo: seq-mean-token-sum-norm (actor.loss_scale_factor max_completion_length); cispo: actor.policy_loss "
     "cispo with token-mean; sapo: actor.use_sapo_loss with seq-mean-token-mean; luspo and vespo are not built"),
    ("sapo_temperature_pos", "actor.sapo_tau_pos", ""),
    ("sapo_temperature_neg", "actor.sapo_tau_neg", ""),
    ("mask_truncated_completions", "actor.mask_no_eos_with_zero", ""),
    ("entropy_coef", "actor.entropy_coeff", "TRL's bonus is the token mean of the entropy whatever loss_type; "
     "rlkit averages it as actor.loss_agg_mode"),
    ("vllm_importance_sampling_correction", "actor.use_decoupled_loss", "TRL weights each token by pi_old / "
     "pi_vllm; rlkit's decoupled loss by pi_prox / pi_behav, bounded by actor.rejection_sampling (TRL's "
     "vllm_importance_sampling_mode: truncate is action clamp, mask is action mask, token or sequence its level)"),
    ("top_entropy_quantile", "", "not built: rlkit trains on every completion token"),
    ("sync_ref_model", "", "not built: rlkit's reference model stays the initial one"),
)
