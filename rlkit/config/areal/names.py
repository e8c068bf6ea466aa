"""The key names of AReaL's configuration reference (its docs/cli_reference.md, in both versions rlkit was built
from), per rlkit section path: which keys exist in AReaL, names only. The test of AReaL's keys holds every one of them
to a schema field or a rule (rlkit.config.areal.keys); the configuration reference and `rlkit explain` read them to say
a field's AReaL name, or that AReaL has none."""

from __future__ import annotations

# AReaL's PPOActor keys: the actor's and (as AReaL gives ref the actor's class) the ref section's
_PPO_ACTOR = (
    "experiment_name trial_name path attn_impl init_from_scratch is_critic mb_spec pad_to_maximum "
    "disable_dropout gradient_checkpointing dtype grad_reduce_dtype optimizer weight_update_mode backend "
    "fsdp use_lora lora_rank lora_alpha target_modules peft_type group_size ppo_n_minibatches eps_clip "
    "eps_clip_higher c_clip temperature reward_norm reward_scaling reward_bias reward_clip "
    "overlong_reward_penalty overlong_tokens overlong_penalty_factor mask_no_eos_with_zero discount "
    "gae_lambda adv_norm kl_ctl kl_estimator recompute_logprob use_decoupled_loss behav_imp_weight_cap "
    "dynamic_sampling log_agent_stats log_agent_stats_keys max_new_tokens use_kernels optimizer_dtype "
    "archon megatron offload enable_tree_training scheduling_spec admin_api_key log_level request_timeout "
    "setup_timeout workers_ready_timeout scheduling_strategy m2_threshold use_sapo_loss sapo_tau_pos "
    "sapo_tau_neg rejection_sampling importance_sampling_level prox_logp_method"
)

# The field names of AReaL's configuration reference (docs/cli_reference.md; both versions in ../shared/seeds/),
# per rlkit section path, plus the DPO example's top-level `beta` and `loss_type`. Names only: which keys exist.
AREAL_KEYS: dict[str, str] = {
    "": (
        "experiment_name trial_name cluster allocation_mode seed total_train_epochs total_train_steps "
        "total_train_n_seqs tokenizer_path train_dataset valid_dataset saver evaluator stats_logger recover "
        "sglang vllm launcher scheduler async_training gconfig rollout actor ref critic model enable_offload "
        "perf_tracer memory_profiler eval_gconfig teacher dynamic_bs beta loss_type"
    ),
    "cluster": "name_resolve cluster_name fileroot n_nodes n_gpus_per_node",
    "cluster.name_resolve": "type nfs_record_root etcd3_addr ray_actor_name",
    "launcher": (
        "inference_server_cpus_per_gpu inference_server_mem_per_gpu trainer_cpus_per_gpu trainer_mem_per_gpu "
        "inference_server_env_vars trainer_env_vars slurm"
    ),
    "launcher.slurm": "srun_additional_args container_type mount trainer_image inference_server_image",
    "vllm": (
        "model seed skip_tokenizer_init enforce_eager dtype distributed_executor_backend max_num_seqs "
        "block_size swap_space cpu_offload_gb max_seq_len_to_capture disable_sliding_window max_model_len "
        "enable_chunked_prefill enable_prefix_caching gpu_memory_utilization worker_extension_cls "
        "enable_sleep_mode uvicorn_log_level no_enable_chunked_prefill no_enable_prefix_caching "
        "gdn_prefill_backend enable_lora max_lora_rank max_loras lora_modules"
    ),
    "sglang": (
        "model_path random_seed skip_tokenizer_init disable_cuda_graph disable_radix_cache "
        "disable_cuda_graph_padding enable_nccl_nvls disable_outlines_disk_cache disable_custom_all_reduce "
        "disable_overlap_schedule enable_mixed_chunk enable_dp_attention enable_ep_moe enable_torch_compile "
        "torch_compile_max_bs cuda_graph_max_bs cuda_graph_bs torchao_config enable_nan_detection "
        "enable_p2p_check triton_attention_reduce_in_fp32 triton_attention_num_kv_splits "
        "num_continuous_decode_steps enable_memory_saver allow_auto_truncate attention_backend "
        "enable_multimodal sampling_backend context_length mem_fraction_static max_running_requests "
        "chunked_prefill_size max_prefill_tokens schedule_policy schedule_conservativeness cpu_offload_gb "
        "dtype kv_cache_dtype dp_size ep_size enable_lora max_lora_rank lora_target_modules lora_paths "
        "max_loaded_loras max_loras_per_batch lora_backend log_level log_level_http log_requests "
        "log_requests_level show_time_cost enable_metrics decode_log_interval enable_multithread_load "
        "enable_fast_load enable_return_routed_experts"
    ),
    "actor": _PPO_ACTOR + " beta loss_type",
    "critic": (
        "experiment_name trial_name path attn_impl init_from_scratch is_critic mb_spec pad_to_maximum "
        "disable_dropout gradient_checkpointing dtype grad_reduce_dtype optimizer weight_update_mode backend "
        "fsdp use_lora lora_rank lora_alpha target_modules peft_type ppo_n_minibatches eps_clip "
        "mask_no_eos_with_zero use_kernels temperature optimizer_dtype archon megatron offload "
        "enable_tree_training scheduling_spec admin_api_key log_level request_timeout setup_timeout "
        "workers_ready_timeout scheduling_strategy"
    ),
    "ref": _PPO_ACTOR,
    "actor.mb_spec": "n_mbs granularity max_tokens_per_mb n_mbs_divisor packing_algorithm",
    "actor.optimizer": (
        "type lr weight_decay beta1 beta2 eps min_lr_ratio lr_scheduler_type warmup_steps_proportion offload "
        "initial_loss_scale min_loss_scale loss_scale_window hysteresis gradient_clipping"
    ),
    "actor.fsdp": (  # ulysses_sp_size: in AReaL's examples/lite files of 2025-09 (tests/data/areal/lite)
        "wrap_policy offload_params memory_efficient_load per_layer_optim_step optim_step_prefetch_layers "
        "shard_vision_across_sp ulysses_sp_size"
    ),
    "critic.fsdp": (  # AReaL's critic has the actor's engine config, fsdp section included
        "wrap_policy offload_params memory_efficient_load per_layer_optim_step optim_step_prefetch_layers "
        "shard_vision_across_sp ulysses_sp_size"
    ),
    "actor.reward_norm": "mean_level mean_leave1out std_level std_unbiased eps group_size",
    "actor.rejection_sampling": "level action metric agg upper lower",
    "gconfig": (
        "n_samples max_new_tokens min_new_tokens max_tokens greedy top_p top_k temperature stop_token_ids "
        "stop frequency_penalty ignore_eos skip_special_tokens lora_name use_beam_search"
    ),
    "rollout": (
        "experiment_name trial_name max_concurrent_rollouts queue_size consumer_batch_size "
        "max_head_offpolicyness enable_rollout_tracing check_trajectory_format schedule_policy setup_timeout "
        "request_timeout request_retries pause_grace_period fileroot tokenizer_path dump_to_file "
        "workers_ready_timeout scheduling_spec backend scheduling_strategy use_lora lora_name agent "
        "return_routed_experts model routing_strategy poll_interval admin_api_key api_url provider_api_key"
    ),
    "rollout.agent": (
        "agent_cls_path admin_api_key scheduling_spec mode tool_call_parser reasoning_parser chat_template_type "
        "engine_max_tokens turn_discount export_style subproc_max_workers session_timeout_seconds "
        "set_reward_finish_timeout"
    ),
    "train_dataset": (
        "path type batch_size shuffle pin_memory num_workers drop_last max_length split num_dataset_workers "
        "dataset_kwargs scheduling_spec setup_timeout"
    ),
    "valid_dataset": (
        "path type batch_size shuffle pin_memory num_workers drop_last max_length split num_dataset_workers "
        "dataset_kwargs scheduling_spec setup_timeout"
    ),
    "saver": "experiment_name trial_name fileroot freq_epochs freq_steps freq_secs mode",
    "recover": (
        "experiment_name trial_name fileroot freq_epochs freq_steps freq_secs mode retries no_save_optim "
        "no_load_optim"
    ),
    "evaluator": "experiment_name trial_name fileroot freq_epochs freq_steps freq_secs eval_before_train",
    "stats_logger": "experiment_name trial_name fileroot wandb swanlab tensorboard trackio",
    "stats_logger.wandb": (
        "mode wandb_base_url wandb_api_key entity project name job_type group notes tags config id_suffix"
    ),
    "stats_logger.swanlab": "project name config logdir mode api_key",
    "stats_logger.tensorboard": "path",
    "stats_logger.trackio": "mode project name space_id",
    "perf_tracer": "experiment_name trial_name fileroot enabled save_interval profile_steps session_tracer",
    "perf_tracer.session_tracer": "enabled flush_threshold",
}
