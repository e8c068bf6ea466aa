"""verl's keys and rlkit's: the single table of names that `rlkit migrate` reads a verl run by (rlkit.config.verl)
and the "coming from verl" page shows (rlkit/cli/key_maps.py wraps these rows as its VERL table). Each row is (verl
key, rlkit key or "" when rlkit has none, note: how the two differ, or why rlkit has none). A verl key with no row
is unknown to rlkit: migrate lists it as such."""

from __future__ import annotations

VERL_KEYS: tuple[tuple[str, str, str], ...] = (
    ("actor_rollout_ref.model.path", "actor.path", ""),
    ("actor_rollout_ref.model.enable_gradient_checkpointing", "actor.gradient_checkpointing", ""),
    ("actor_rollout_ref.model.lora_rank", "actor.lora_rank", "verl turns LoRA on with a rank > 0; rlkit with "
       "actor.use_lora: true"),
    ("actor_rollout_ref.model.lora_alpha", "actor.lora_alpha", ""),
    ("actor_rollout_ref.model.target_modules", "actor.target_modules", ""),
    ("actor_rollout_ref.actor.optim.lr", "actor.optimizer.lr", ""),
    ("actor_rollout_ref.actor.optim.weight_decay", "actor.optimizer.weight_decay", ""),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", "actor.optimizer.warmup_steps_proportion", ""),
    ("actor_rollout_ref.actor.optim.warmup_style", "actor.optimizer.lr_scheduler_type", ""),
    ("actor_rollout_ref.actor.optim.min_lr_ratio", "actor.optimizer.min_lr_ratio", ""),
    ("actor_rollout_ref.actor.grad_clip", "actor.optimizer.gradient_clipping", ""),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "actor.ppo_n_minibatches", "verl gives the size of a "
       "minibatch, rlkit the number of minibatches (optimizer steps) per training step"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor.mb_spec.n_mbs", "rlkit sets the number of "
       "micro-batches, or a token budget per micro-batch (actor.mb_spec.max_tokens_per_mb)"),
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor.mb_spec.max_tokens_per_mb", ""),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "actor.fsdp.ulysses_sp_size", "Ulysses over the "
       "packed rows of grpo, opmd, sft and ppo"),
    ("critic.ulysses_sequence_parallel_size", "critic.fsdp.ulysses_sp_size", "ppo: must equal the actor's"),
    ("actor_rollout_ref.model.use_remove_padding", "actor.mb_spec.packing", "rlkit packs by default (true)"),
    ("actor_rollout_ref.actor.ppo_epochs", "actor.ppo_epochs", "the same minibatches each pass, as verl's "
       "with its default shuffle: false"),
    ("critic.ppo_epochs", "critic.ppo_epochs", "unset: actor.ppo_epochs, as in verl"),
    ("actor_rollout_ref.actor.clip_ratio", "actor.eps_clip", ""),
    ("actor_rollout_ref.actor.clip_ratio_low", "actor.eps_clip", ""),
    ("actor_rollout_ref.actor.clip_ratio_high", "actor.eps_clip_higher", ""),
    ("actor_rollout_ref.actor.clip_ratio_c", "actor.c_clip", ""),
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "actor.policy_loss", "vanilla: the default (ppo); "
       "gspo: actor.importance_sampling_level=sequence; sapo: actor.use_sapo_loss=true; cispo: cispo; geo_mean: "
       "gmpo (with a seq-mean actor.loss_agg_mode: verl's geo_mean averages over the sequences); gpg: gpg; the "
       "clip_ratio keys are cispo's and gmpo's bounds; verl's other modes are not built"),
    ("actor_rollout_ref.actor.policy_loss.tau_pos", "actor.sapo_tau_pos", "SAPO's temperature for A > 0"),
    ("actor_rollout_ref.actor.policy_loss.tau_neg", "actor.sapo_tau_neg", "SAPO's temperature for A <= 0"),
    ("actor_rollout_ref.actor.use_kl_loss", "actor.kl_loss_coef", "rlkit's KL loss is on when kl_loss_coef > 0"),
    ("actor_rollout_ref.actor.kl_loss_coef", "actor.kl_loss_coef", ""),
    ("actor_rollout_ref.actor.kl_loss_type", "actor.kl_loss_type", "rlkit names the estimators k1, k2, k3 "
       "(verl's kl, mse, low_var_kl)"),
    ("actor_rollout_ref.actor.entropy_coeff", "actor.entropy_coeff", "the entropy is averaged as the policy loss is "
       "(actor.loss_agg_mode), as in verl"),
    ("actor_rollout_ref.actor.loss_agg_mode", "actor.loss_agg_mode", "the same four names, over every rank's "
       "minibatch; the KL loss term is averaged the same way, the critic's value loss stays a token-mean"),
    ("actor_rollout_ref.actor.loss_scale_factor", "actor.loss_scale_factor", "seq-mean-token-sum-norm's constant; "
       "verl's default is the padded response length, rlkit's gconfig.max_new_tokens"),
    ("actor_rollout_ref.rollout.name", "allocation_mode", "the engine is the first part of allocation_mode "
       "(vllm:... or sglang:...)"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", "allocation_mode", "t of the server part, e.g. "
       "vllm:d2t4"),
    ("actor_rollout_ref.rollout.n", "gconfig.n_samples", ""),
    ("actor_rollout_ref.rollout.temperature", "gconfig.temperature", ""),
    ("actor_rollout_ref.rollout.top_p", "gconfig.top_p", ""),
    ("actor_rollout_ref.rollout.top_k", "gconfig.top_k", ""),
    ("actor_rollout_ref.rollout.gpu_memory_utilization", "vllm.gpu_memory_utilization", "sglang: "
       "sglang.mem_fraction_static"),
    ("actor_rollout_ref.rollout.enforce_eager", "vllm.enforce_eager", ""),
    ("actor_rollout_ref.rollout.max_num_seqs", "vllm.max_num_seqs", ""),
    ("actor_rollout_ref.ref.fsdp_config.param_offload", "", "rlkit offloads nothing"),
    ("critic.model.path", "critic.path", ""),
    ("critic.optim.lr", "critic.optimizer.lr", ""),
    ("critic.cliprange_value", "critic.eps_clip", ""),
    ("algorithm.adv_estimator", "type", "gae (verl's default): type ppo (a critic, advantages whitened over the "
     "batch: actor.adv_norm); the others type grpo with the settings giving their advantages: grpo and "
     "grpo_vectorized: actor.reward_norm at group level; rloo and rloo_vectorized: its leave-one-out group mean; "
     "grpo_passk: actor.passk_advantage; opo: actor.adv_norm's token-weighted group mean; gpg: the group mean and "
     "actor.gpg_scale; reinforce_plus_plus: the returns whitened over the batch (actor.adv_norm); "
     "reinforce_plus_plus_baseline: the group mean subtracted, then whitened; remax and optimal_token_baseline are "
     "not built (docs/algorithms.md)"),
    ("algorithm.gamma", "actor.discount", ""),
    ("algorithm.lam", "actor.gae_lambda", ""),
    ("algorithm.filter_groups.enable", "actor.dynamic_sampling", "DAPO's filter: verl refills the batch with new "
       "groups, rlkit drops the flat ones and trains on fewer; refused unless actor.dynamic_sampling is passed"),
    ("algorithm.use_kl_in_reward", "actor.kl_ctl", "rlkit's KL reward penalty is on when kl_ctl > 0; under "
       "verl's summed estimators (grpo, rloo, opo, gpg, ...) also actor.kl_penalty_level: sequence"),
    ("algorithm.kl_ctrl.kl_coef", "actor.kl_ctl", "the coefficient (adaptive: the starting one)"),
    ("algorithm.kl_penalty", "actor.kl_estimator", "rlkit names the estimators k1, k2, k3"),
    ("algorithm.norm_adv_by_std_in_grpo", "actor.reward_norm.std_level", "group: divide by the group's std; "
       "null: do not (Dr. GRPO)"),
    ("data.train_files", "train_dataset.path", ""),
    ("data.val_files", "valid_dataset.path", ""),
    ("data.train_batch_size", "train_dataset.batch_size", "prompts per training step, as in verl"),
    ("data.prompt_key", "train_dataset.prompt_key", "verl's rows hold chat messages there, rendered with the "
     "model's chat template as in verl"),
    ("data.max_prompt_length", "train_dataset.max_length", "rlkit drops longer prompts (counted in the trainer "
       "log) instead of truncating them"),
    ("data.max_response_length", "gconfig.max_new_tokens", ""),
    ("data.shuffle", "train_dataset.shuffle", ""),
    ("custom_reward_function.path", "reward.fn", "rlkit names file and function in one value: "
       "/path/file.py:function or module.path:function, called as fn(prompt, completion, row), not verl's "
       "compute_score(data_source, solution_str, ground_truth, extra_info): migrate asks for a reward.fn"),
    ("custom_reward_function.name", "reward.fn", "the function of custom_reward_function.path"),
    ("trainer.project_name", "experiment_name", ""),
    ("trainer.experiment_name", "trial_name", ""),
    ("trainer.nnodes", "cluster.n_nodes", ""),
    ("trainer.n_gpus_per_node", "cluster.n_gpus_per_node", ""),
    ("trainer.total_epochs", "total_train_epochs", ""),
    ("trainer.total_training_steps", "total_train_steps", ""),
    ("trainer.save_freq", "recover.freq_steps", "recover checkpoints (resume); Hugging Face models for use: "
       "saver.freq_steps"),
    ("trainer.resume_mode", "recover.mode", ""),
    ("trainer.max_actor_ckpt_to_keep", "recover.keep_last", ""),
    ("trainer.test_freq", "evaluator.freq_steps", ""),
    ("trainer.val_before_train", "evaluator.eval_on_startup", ""),
    ("trainer.default_local_dir", "cluster.fileroot", "rlkit puts every trial under <fileroot>/<experiment>/"
       "<trial>"),
    ("trainer.logger", "stats_logger.wandb.mode", "each sink has its own section: stats_logger.wandb, "
       "stats_logger.tensorboard, stats_logger.swanlab; metrics.jsonl is always written"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size", "", "deprecated in verl; rlkit sets actor.mb_spec"),
    ("actor_rollout_ref.actor.use_dynamic_bsz", "actor.mb_spec.packing", "token-budgeted micro-batches: rlkit's "
     "packing, on by default, its budget actor.mb_spec.max_tokens_per_mb"),
    ("actor_rollout_ref.actor.fsdp_config.param_offload", "", "rlkit offloads nothing"),
    ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", "", "rlkit offloads nothing"),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "", "the trainer computes log-probs in the "
     "actor's micro-batches (actor.mb_spec)"),
    ("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", "", "the trainer computes log-probs in the actor's "
     "micro-batches (actor.mb_spec)"),
    ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "", "the trainer computes log-probs in the actor's "
     "micro-batches (actor.mb_spec.max_tokens_per_mb)"),
    ("actor_rollout_ref.rollout.mode", "", "rlkit's servers always answer asynchronously, over HTTP"),
    ("actor_rollout_ref.rollout.free_cache_engine", "", "rlkit's servers keep GPUs of their own (nothing is freed "
     "for training)"),
    ("actor_rollout_ref.rollout.load_format", "", "rlkit's servers load actor.path and take weight pushes"),
    ("actor_rollout_ref.rollout.enable_chunked_prefill", "", "vLLM's option: vllm.extra_args"),
    ("actor_rollout_ref.rollout.max_num_batched_tokens", "", "vLLM's option: vllm.extra_args"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "", "the reference's forwards use the actor's "
     "micro-batches (actor.mb_spec)"),
    ("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", "", "the reference's forwards use the actor's micro-batches"),
    ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", "", "the reference's forwards use the actor's "
     "micro-batches (actor.mb_spec.max_tokens_per_mb)"),
    ("actor_rollout_ref.ref.fsdp_config.optimizer_offload", "", "rlkit offloads nothing"),
    ("critic.model.enable_gradient_checkpointing", "critic.gradient_checkpointing", ""),
    ("critic.model.use_remove_padding", "critic.mb_spec.packing", "rlkit packs by default (true)"),
    ("critic.model.fsdp_config.param_offload", "", "rlkit offloads nothing"),
    ("critic.model.fsdp_config.optimizer_offload", "", "rlkit offloads nothing"),
    ("critic.optim.weight_decay", "critic.optimizer.weight_decay", ""),
    ("critic.optim.lr_warmup_steps_ratio", "critic.optimizer.warmup_steps_proportion", ""),
    ("critic.grad_clip", "critic.optimizer.gradient_clipping", ""),
    ("critic.ppo_mini_batch_size", "critic.ppo_n_minibatches", "a size in verl, a count in rlkit: "
     "data.train_batch_size / ppo_mini_batch_size (unset: the actor's, as in verl)"),
    ("critic.ppo_micro_batch_size_per_gpu", "", "rlkit sets the critic's micro-batches in critic.mb_spec"),
    ("critic.ppo_max_token_len_per_gpu", "critic.mb_spec.max_tokens_per_mb", ""),
    ("critic.use_dynamic_bsz", "critic.mb_spec.packing", "rlkit packs by default (true)"),
    ("algorithm.kl_ctrl.type", "actor.kl_ctl_adaptive", "fixed: actor.kl_ctl alone; adaptive: the "
     "actor.kl_ctl_adaptive block (with the KL reward on)"),
    ("algorithm.kl_ctrl.target_kl", "actor.kl_ctl_adaptive.target_kl", "adaptive only"),
    ("algorithm.kl_ctrl.horizon", "actor.kl_ctl_adaptive.horizon", "adaptive only"),
    ("data.filter_overlong_prompts", "", "rlkit always drops prompts longer than train_dataset.max_length"),
    ("data.truncation", "", "rlkit drops prompts longer than train_dataset.max_length, it truncates none: "
     "error, or any with data.filter_overlong_prompts, is left out; left, right and middle are refused"),
    ("data.reward_fn_key", "", "the row column by which verl picks a scorer (data_source); rlkit scores every row "
     "with reward.fn (or the weighted reward.fns)"),
    ("data.return_raw_chat", "", "rlkit's servers are given the prompt as the dataset holds it"),
    ("reward_model.enable", "reward.fn", "true: reward.fn reward_model, the model's score alone as in verl; with "
     "custom_reward_function.path too, refused (name reward_model or the function in reward.fn / reward.fns)"),
    ("reward_model.model.path", "reward.reward_model_path", "a Hugging Face *ForSequenceClassification with one "
     "label, as verl reads it (or an rlkit rw model)"),
    ("reward_model.rollout.tensor_model_parallel_size", "reward.reward_model_tensor_parallel_size", "verl's "
     "reward-loop servers (its default 2); the legacy worker's FSDP becomes servers of 1 GPU"),
    ("reward_model.enable_resource_pool", "reward.reward_model_engine_num", "true: the pool's nnodes x "
     "n_gpus_per_node / tensor_model_parallel_size servers, on nodes added to the run; false (verl colocates the "
     "model with the actor): one server, its GPUs taken from the run's (rlkit's servers have GPUs of their own)"),
    ("reward_model.n_gpus_per_node", "reward.reward_model_engine_num", "with enable_resource_pool: its pool's GPUs "
     "per node"),
    ("reward_model.nnodes", "reward.reward_model_engine_num", "with enable_resource_pool: its pool's nodes"),
    ("reward_model.rollout.max_model_len", "reward.reward_model_max_model_len", "null: the model's own context, "
     "as rlkit's unset"),
    ("reward_model.rollout.prompt_length", "", "a generation limit of verl's reward-model servers, not their "
     "context (reward.reward_model_max_model_len)"),
    ("reward_model.model.input_tokenizer", "", "rlkit always renders the conversation with the reward model's own "
     "chat template"),
    ("reward_model.num_workers", "", "verl's processes that query the reward model; rlkit's reward_model scores in "
     "one worker (reward.num_workers is for reward functions)"),
    ("reward_model.reward_manager", "", "rlkit calls reward.fn per completion (its own parallelism: "
     "reward.num_workers)"),
    ("trainer.critic_warmup", "", "rlkit trains the actor from the first step (verl's 0); more is refused"),
    ("trainer.use_legacy_worker_impl", "", "verl's worker code"),
    ("trainer.balance_batch", "", "verl's reordering of a batch over its ranks: rlkit has no such setting"),
    ("trainer.device", "", "rlkit runs on the GPUs of allocation_mode"),
    ("trainer.val_generations_to_log_to_wandb", "", "rlkit has no such setting"),
    ("trainer.log_val_generations", "", "rlkit has no such setting"),
    # the optimizer's other knobs (rlkit.config.verl.learning: verl's defaults are written where the run leaves them)
    ("actor_rollout_ref.actor.optim.betas", "actor.optimizer.beta1", "two keys: beta1 and beta2; unset: verl's "
     "(0.9, 0.999), with torch AdamW's eps 1e-8"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps", "actor.optimizer.warmup_steps_proportion", "a count, which "
     "wins over the ratio when > 0: its fraction of trainer.total_training_steps"),
    ("actor_rollout_ref.actor.optim.lr_scheduler_type", "actor.optimizer.lr_scheduler_type", "warmup_style, its "
     "older name, wins when set, as in verl"),
    ("actor_rollout_ref.actor.optim.lr_decay_style", "actor.optimizer.lr_scheduler_type", "megatron's name: "
     "constant, linear or cosine (to lr 0 by the last step; megatron's min_lr and lr_decay_steps are not rlkit's)"),
    ("actor_rollout_ref.actor.optim.clip_grad", "actor.optimizer.gradient_clipping", "actor.grad_clip's twin"),
    ("actor_rollout_ref.actor.optim.total_training_steps", "", "verl fills it in at run time: rlkit's is "
     "total_train_steps"),
    ("actor_rollout_ref.actor.optim.optimizer", "", "AdamW is rlkit's adam; another is refused"),
    ("actor_rollout_ref.actor.optim.override_optimizer_config.*", "", "Megatron's optimizer offload: rlkit "
     "offloads nothing"),
    ("critic.optim.betas", "critic.optimizer.beta1", "as the actor's"),
    ("actor_rollout_ref.rollout.max_model_len", "vllm.max_model_len", ""),
    ("actor_rollout_ref.rollout.val_kwargs.do_sample", "eval_gconfig.greedy", "its opposite; unset: greedy, as "
     "verl validates"),
    ("actor_rollout_ref.rollout.val_kwargs.temperature", "eval_gconfig.temperature", "with do_sample true"),
    ("actor_rollout_ref.rollout.val_kwargs.top_p", "eval_gconfig.top_p", "with do_sample true"),
    ("actor_rollout_ref.rollout.val_kwargs.top_k", "eval_gconfig.top_k", "with do_sample true"),
    ("actor_rollout_ref.rollout.val_kwargs.n", "eval_gconfig.n_samples", ""),
    # infrastructure: how verl runs, not what it learns
    ("actor_rollout_ref.actor.megatron.*", "", "Megatron's parallelism and offload: rlkit's trainer is FSDP"),
    ("actor_rollout_ref.ref.megatron.*", "", "Megatron's parallelism and offload: rlkit's trainer is FSDP"),
    ("critic.megatron.*", "", "Megatron's parallelism and offload: rlkit's trainer is FSDP"),
    ("actor_rollout_ref.actor.profiler.*", "", "verl's profiler"),
    ("actor_rollout_ref.ref.profiler.*", "", "verl's profiler"),
    ("critic.profiler.*", "", "verl's profiler"),
    ("global_profiler.*", "", "verl's profiler"),
    ("actor_rollout_ref.rollout.engine_kwargs.*", "", "the engine's own options: vllm.extra_args"),
    ("actor_rollout_ref.rollout.trace.*", "", "verl's rollout tracing"),
    ("actor_rollout_ref.rollout.checkpoint_engine.*", "", "how verl moves weights into its engines: rlkit pushes "
     "them by actor.weight_update_mode"),
    ("actor_rollout_ref.actor.checkpoint.*", "", "what verl's checkpoints hold: rlkit's recover checkpoints hold "
     "what resuming needs"),
    ("actor_rollout_ref.actor.use_torch_compile", "", "a kernel choice"),
    ("actor_rollout_ref.ref.use_torch_compile", "", "a kernel choice"),
    ("actor_rollout_ref.model.use_fused_kernels", "", "a kernel choice"),
    ("actor_rollout_ref.model.fused_kernel_options.impl_backend", "", "a kernel choice"),
    ("actor_rollout_ref.actor.entropy_from_logits_with_chunking", "", "memory: the same entropy"),
    ("actor_rollout_ref.ref.entropy_from_logits_with_chunking", "", "memory: the same entropy"),
    ("actor_rollout_ref.actor.entropy_checkpointing", "", "memory: the same entropy"),
    ("actor_rollout_ref.actor.strategy", "", "fsdp or fsdp2: rlkit's trainer is FSDP"),
    ("actor_rollout_ref.ref.strategy", "", "fsdp or fsdp2: rlkit's trainer is FSDP"),
    ("critic.strategy", "", "fsdp or fsdp2: rlkit's trainer is FSDP"),
    ("actor_rollout_ref.actor.fsdp_config.fsdp_size", "", "FSDP's sharding group: rlkit shards over the trainer"),
    ("actor_rollout_ref.actor.fsdp_config.forward_prefetch", "", "FSDP's prefetch (speed only)"),
    ("actor_rollout_ref.ref.fsdp_config.forward_prefetch", "", "FSDP's prefetch (speed only)"),
    ("actor_rollout_ref.actor.fsdp_config.use_orig_params", "", "FSDP's parameter views (memory only)"),
    ("actor_rollout_ref.ref.ulysses_sequence_parallel_size", "", "the reference's: rlkit's is the actor's"),
    ("actor_rollout_ref.model.use_shm", "", "how verl copies the model to the nodes"),
    ("actor_rollout_ref.model.trust_remote_code", "", "rlkit loads the model's own code when it has any"),
    ("critic.model.trust_remote_code", "", "rlkit loads the model's own code when it has any"),
    ("data.trust_remote_code", "", "rlkit loads the model's own code when it has any"),
    ("actor_rollout_ref.hybrid_engine", "", "rlkit's servers and trainer have GPUs of their own"),
    ("actor_rollout_ref.nccl_timeout", "", "verl's collectives' timeout"),
    ("actor_rollout_ref.rollout.layered_summon", "", "how verl gathers LoRA weights for its engines"),
    ("actor_rollout_ref.rollout.multi_stage_wake_up", "", "how verl's colocated engines take back their memory"),
    ("actor_rollout_ref.rollout.calculate_log_probs", "", "rlkit's servers return the log-probs it needs"),
    ("actor_rollout_ref.rollout.enable_prefix_caching", "", "vLLM's option (speed only)"),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size", "", "deprecated in verl: the trainer computes "
     "log-probs in the actor's micro-batches"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size", "", "deprecated in verl: the reference's forwards use the "
     "actor's micro-batches"),
    ("critic.forward_micro_batch_size_per_gpu", "", "rlkit sets the critic's micro-batches in critic.mb_spec"),
    ("critic.forward_max_token_len_per_gpu", "", "the critic's forwards use critic.mb_spec"),
    ("data.dataloader_num_workers", "", "verl's loader processes"),
    ("data.val_batch_size", "", "how verl batches its validation requests"),
    ("trainer.max_critic_ckpt_to_keep", "", "recover.keep_last counts the trial's checkpoints"),
    ("trainer.resume_from_path", "", "read with resume_mode resume_path, which is refused"),
    ("actor_rollout_ref.actor.fsdp_config.mixed_precision.*", "", "FSDP's mixed precision: rlkit trains in "
     "actor.dtype"),
    ("actor_rollout_ref.rollout.skip_tokenizer_init", "", "how verl starts its engines"),
    ("actor_rollout_ref.actor.use_prefix_grouper", "", "a shared-prompt speed-up: the same loss"),
    ("actor_rollout_ref.actor.router_replay.*", "", "router replay's files and target: verl's code reads "
     "router_replay.mode only (R2 and R3 are refused)"),
    ("actor_rollout_ref.ref.router_replay.*", "", "the reference's router replay: verl reads the actor's only "
     "(verl/workers/megatron_workers.py)"),
    ("actor_rollout_ref.rollout.enable_rollout_routing_replay", "", "records the engine's MoE routing, which only "
     "actor.router_replay.mode R3 (refused) reads"),
    ("data.image_key", "", "a vision-language run is refused: rlkit trains text-only models"),
    ("data.video_key", "", "a vision-language run is refused: rlkit trains text-only models"),
    ("reward_model.reward_kwargs.overlong_buffer_cfg.enable", "actor.overlong_reward_penalty", "DAPO's overlong "
     "penalty (reward_manager dapo): the same penalty at every length, converted when reward_kwargs.max_resp_len is "
     "not data.max_response_length"),
    ("reward_model.reward_kwargs.overlong_buffer_cfg.len", "actor.overlong_tokens", "with max_resp_len = "
     "data.max_response_length, the same number"),
    ("reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor", "actor.overlong_penalty_factor", "with "
     "max_resp_len = data.max_response_length, the same number"),
)
