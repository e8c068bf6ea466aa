"""ChatLearn's keys and rlkit's: the rows of the "coming from ChatLearn" page and of `rlkit explain`
(rlkit/cli/key_maps.py wraps them). Each row is (ChatLearn name, rlkit key or "" when rlkit has none, note: how the
two differ, or why rlkit has none)."""

from __future__ import annotations

CHATLEARN_KEYS: tuple[tuple[str, ...], ...] = (
    ("runtime_args.exp_name", "experiment_name"),
    ("runtime_args.output_dir", "cluster.fileroot"),
    ("runtime_args.train_backend", "allocation_mode", "the trainer part is fsdp:..."),
    ("runtime_args.rollout_backend", "allocation_mode", "the server part: vllm:... or sglang:..."),
    ("runtime_args.colocation", "", "rlkit runs servers and trainer on GPUs of their own"),
    ("runtime_args.data_path", "train_dataset.path"),
    ("runtime_args.eval_data_path", "valid_dataset.path"),
    ("runtime_args.num_episode", "total_train_steps", "one training step is one episode"),
    ("runtime_args.sample_per_episode", "train_dataset.batch_size", "rlkit counts prompts; samples per step are "
       "batch_size x gconfig.n_samples"),
    ("runtime_args.train_global_batch_size", "actor.ppo_n_minibatches", "rlkit gives the number of minibatches "
       "(sample_per_episode / train_global_batch_size)"),
    ("runtime_args.save_episode_interval", "saver.freq_steps"),
    ("runtime_args.eval_episode_interval", "evaluator.freq_steps"),
    ("runtime_args.enable_eval_before_training", "evaluator.eval_on_startup"),
    ("runtime_args.data_shuffle", "train_dataset.shuffle"),
    ("runtime_args.log_args_dict.enable_wandb", "stats_logger.wandb.mode", "online or offline to turn it on"),
    ("runtime_args.log_args_dict.wandb_project", "stats_logger.wandb.project"),
    ("models.policy.load", "actor.path", "the servers load actor.path too (vllm.model overrides)"),
    ("models.policy.num_inference_per_prompt", "gconfig.n_samples"),
    ("models.policy.seq_length", "gconfig.max_new_tokens"),
    ("models.policy.temperature", "gconfig.temperature"),
    ("models.policy.top_p", "gconfig.top_p"),
    ("models.policy.eval_temperature", "eval_gconfig.temperature"),
    ("models.policy.eval_top_p", "eval_gconfig.top_p"),
    ("models.policy.eval_top_k", "eval_gconfig.top_k"),
    ("models.policy.gpu_memory_utilization", "vllm.gpu_memory_utilization"),
    ("models.policy.tensor_model_parallel_size", "allocation_mode", "t of the server part, e.g. vllm:d2t4"),
    ("models.policy_trainer.load", "actor.path"),
    ("models.policy_trainer.optimizer.lr", "actor.optimizer.lr"),
    ("models.policy_trainer.optimizer.clip_grad", "actor.optimizer.gradient_clipping"),
    ("models.policy_trainer.neg_clip_ratio", "actor.eps_clip"),
    ("models.policy_trainer.pos_clip_ratio", "actor.eps_clip_higher"),
    ("models.policy_trainer.kl_coef", "actor.kl_loss_coef"),
    ("models.policy_trainer.entropy_coef", "actor.entropy_coeff"),
    ("models.policy_trainer.gradient_checkpointing", "actor.gradient_checkpointing"),
    ("models.policy_trainer.use_group_sequence_policy", "actor.importance_sampling_level", "sequence: GSPO"),
    ("models.policy_trainer.train_micro_batch_size", "actor.mb_spec.n_mbs", "rlkit sets the number of "
       "micro-batches, or a token budget (actor.mb_spec.max_tokens_per_mb)"),
    ("models.policy_trainer.packing", "actor.mb_spec.packing", "ChatLearn's default is false, rlkit's true; "
       "with packing, ChatLearn ignores train_micro_batch_size, rlkit takes actor.mb_spec.n_mbs as the fewest "
       "micro-batches"),
    ("models.policy_trainer.max_token_in_packing", "actor.mb_spec.max_tokens_per_mb"),
    ("models.policy_trainer.tensor_model_parallel_size", "", "rlkit's trainer shards with FSDP only"),
    ("models.policy_trainer.ulysses_sequence_parallel_size", "actor.fsdp.ulysses_sp_size", "Ulysses over the "
       "packed rows of grpo, opmd, sft and ppo"),
    ("models.ref_policy.load", "ref.path", "empty: actor.path"),
    ("models.ref_policy.packing", "actor.mb_spec.packing", "the reference's forwards pack as the actor's do"),
    ("models.ref_policy.max_token_in_packing", "actor.mb_spec.max_tokens_per_mb", "the reference's micro-batches "
       "are the actor's"),
)
