"""AReaL's inference-server keys (`vllm.*`, `sglang.*`) that rlkit's schema lacks, with their rules.

AReaL turns each of these into a server flag, and leaves a flag out when its value is null or false. rlkit passes
none of them (only its schema's fields and `extra_args`), so a null or false value is what rlkit does, and anything
else is refused with the `extra_args` spelling that passes it. Keys that do not change what the servers compute
(logging, the tokenizer rlkit does not use) are accepted whatever their value.
"""

from __future__ import annotations

from rlkit.config.allocation import parse_allocation
from rlkit.config.areal.rules import SAME, Rule, inert, off, same, same_value
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import ConfigError

TOKEN_IDS = inert("rlkit sends and reads token ids, whether the server loads its tokenizer or not")
SERVER_LOGS = inert("logging and metrics of the server only")


def serves_with(backend: str, c: ExperimentConfig) -> bool:
    """Whether the config's servers are `backend` (AReaL configs carry both server sections; one is read)."""
    try:
        server = parse_allocation(c.allocation_mode).server
    except ConfigError:
        return True  # the layout check reports it; judge the key as if it were read
    return server is not None and server.backend == backend


def server_flag(backend: str, key: str) -> Rule:
    """A server option rlkit does not pass: fine when null or false (AReaL passes nothing then either), or when the
    servers are of the other backend (nothing reads the section)."""
    return Rule(SAME, f"AReaL passes no flag for null or false, and neither does rlkit; none when the servers are "
                      f"not {backend}",
                ok=lambda v, c: v is None or v is False or not serves_with(backend, c),
                refused="rlkit does not pass this server flag",
                fix=f"pass it as {backend}.extra_args: {{{key}: <value>}} (the server flag), or remove it")


def _flags(backend: str, keys: str) -> dict[str, Rule]:
    return {key: server_flag(backend, key) for key in keys.split()}


def _lora_rank_fits(value: object, rank: int) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= rank)


def _lora_rules(backend: str, name: str) -> dict[str, Rule]:
    """The LoRA server flags rlkit sets itself from actor.use_lora and actor.lora_rank (inert for the other
    backend's servers)."""
    return {
        "enable_lora": same(f"rlkit starts {name} servers with LoRA exactly when actor.use_lora",
                            lambda v, c: v is c.actor.use_lora or not serves_with(backend, c),
                            fix="remove it (rlkit's key is actor.use_lora)", expected=lambda c: c.actor.use_lora),
        "max_lora_rank": same("rlkit starts the servers with a --max-lora-rank that holds actor.lora_rank",
                              lambda v, c: _lora_rank_fits(v, c.actor.lora_rank) or not serves_with(backend, c),
                              fix="remove it (rlkit derives it from actor.lora_rank)"),
    }


VLLM: dict[str, Rule] = {
    **_flags("vllm", "block_size swap_space cpu_offload_gb max_seq_len_to_capture disable_sliding_window "
                     "enable_chunked_prefill no_enable_chunked_prefill gdn_prefill_backend max_loras"),
    "skip_tokenizer_init": TOKEN_IDS,
    "uvicorn_log_level": SERVER_LOGS,
    "distributed_executor_backend": inert("rlkit picks vLLM's executor for its tensor-parallel layout"),
    "worker_extension_cls": inert("rlkit installs its own worker extension (weight updates, the probe)"),
    "enable_sleep_mode": off("vLLM's sleep mode (GPU sharing)", False),
    "no_enable_prefix_caching": same_value("vllm.enable_prefix_caching", lambda c: not c.vllm.enable_prefix_caching,
                                           why="rlkit's key is vllm.enable_prefix_caching (the opposite)"),
    **_lora_rules("vllm", "vLLM"),
    "lora_modules": off("adapters loaded at server start", None, []),
}

SGLANG: dict[str, Rule] = {
    **_flags("sglang", "disable_cuda_graph disable_cuda_graph_padding enable_nccl_nvls disable_outlines_disk_cache "
                       "disable_custom_all_reduce disable_overlap_schedule enable_mixed_chunk enable_dp_attention "
                       "enable_ep_moe enable_torch_compile torch_compile_max_bs cuda_graph_max_bs cuda_graph_bs "
                       "torchao_config enable_nan_detection enable_p2p_check triton_attention_reduce_in_fp32 "
                       "triton_attention_num_kv_splits num_continuous_decode_steps enable_memory_saver "
                       "allow_auto_truncate attention_backend enable_multimodal sampling_backend "
                       "max_running_requests chunked_prefill_size max_prefill_tokens schedule_policy "
                       "schedule_conservativeness cpu_offload_gb kv_cache_dtype "
                       "lora_target_modules lora_paths max_loaded_loras max_loras_per_batch lora_backend "
                       "enable_multithread_load enable_fast_load enable_return_routed_experts"),
    **_lora_rules("sglang", "SGLang"),
    "skip_tokenizer_init": TOKEN_IDS,
    **{key: SERVER_LOGS for key in ("log_level", "log_level_http", "log_requests", "log_requests_level",
                                    "show_time_cost", "enable_metrics", "decode_log_interval")},
    "dp_size": off("SGLang's in-server data parallelism (rlkit starts one server per replica, the d of "
                   "allocation_mode)", None, 1),
    "ep_size": off("expert parallelism", None, 1),
}
