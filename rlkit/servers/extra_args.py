"""Which `vllm.extra_args` / `sglang.extra_args` rlkit passes to a server, checked at submit (pure, no vLLM import).

`extra_args` reach the server's argv, so they could undo what rlkit sets up: the token guard (a gRPC port, a Unix
socket, TLS, a config file that sets anything), the server's address, model and GPU count (`host`, `model`,
`pipeline_parallel_size`, ...), or put a secret on argv (`api_key`, `hf_token`). A deny-list refuses those: both
servers have hundreds of options, and an allow-list would refuse the tuning knobs users need. Both servers parse
with argparse, which accepts any unambiguous prefix of an option (`--grpc-p` is `--grpc-port`): vLLM keys must be
exact options of vLLM 0.32 (`rlkit.servers.vllm.flags`), and an SGLang key that is a prefix of a refused option is
refused too. Values must not start with `-` (argparse would read `[1, "--uds=/x"]` as a second option).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from pathlib import PurePath

from rlkit.servers.vllm.flags import VLLM_FLAGS, VLLM_FLAGS_VERSION

Problem = tuple[str, str]  # (field, message naming the problem and its fix)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_IMPORT_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")

_OWN_ADDRESS = "rlkit binds the server to a free port of its own and registers that address"
_GUARD_HTTP = "rlkit's token guard and its clients speak plain HTTP on the TCP port rlkit registers"
_SECRET = "a secret on the command line is readable by every local user"
_NO_MULTI_NODE = "one rlkit server runs on one node; multi-node servers are not part of rlkit's plan"
_OPENS_LISTENER = "opens a listener of its own that rlkit's token guard does not cover"
_GPUS = "changes the number of GPUs per server, which allocation_mode reserves"
_DP = "rlkit runs one server per data-parallel rank (allocation_mode vllm:dN/sglang:dN)"
_CONFIG_FILE = "a config file can set any option, past these checks; give the options as extra_args"

# Refused options of both servers: {name: why}. Names use underscores, as after `flag_name`.
VLLM_REFUSED: dict[str, str] = {
    "model": "rlkit sets the model (vllm.model, or actor.path)",
    "host": _OWN_ADDRESS,
    "port": _OWN_ADDRESS,
    "tensor_parallel_size": "rlkit sets it from allocation_mode (vllm:tN)",
    "served_model_name": "rlkit's clients address the model by the name rlkit gives it",
    "worker_extension_cls": "rlkit's weight sync needs its own worker extension, and vLLM takes one",
    "weight_transfer_config": "rlkit sets it from actor.weight_update_mode (xccl: the broadcast backend)",
    "api_key": f"{_SECRET}; the trial token already guards every route",
    "hf_token": f"{_SECRET}; set HF_TOKEN in the job's environment instead",
    "config": _CONFIG_FILE,
    "grpc": "serves gRPC instead of HTTP on the port, and rlkit's token guard covers HTTP only",
    "grpc_port": _OPENS_LISTENER,
    "uds": "serves on a Unix socket instead of the TCP port rlkit registers and guards",
    "headless": "runs no API server, so the step would have nothing to serve",
    "root_path": "moves the routes rlkit's clients and guard check call",
    "distributed_executor_backend": "rlkit runs vLLM's own executor; ray would start a Ray cluster with listeners of "
    "its own",
    "kv_events_config": f"publishes KV-cache events on a ZMQ socket: {_OPENS_LISTENER}",
    "kv_transfer_config": f"KV-transfer connectors open side channels: {_OPENS_LISTENER}",
    "ec_transfer_config": f"encoder-cache connectors open side channels: {_OPENS_LISTENER}",
    "pipeline_parallel_size": _GPUS,
    "prefill_context_parallel_size": _GPUS,
    "nnodes": _NO_MULTI_NODE,
    "node_rank": _NO_MULTI_NODE,
    "master_addr": _NO_MULTI_NODE,
    "master_port": _NO_MULTI_NODE,
    **{n: _GUARD_HTTP for n in VLLM_FLAGS if n.startswith("ssl_") or n == "enable_ssl_refresh"},
    **{n: f"{_DP}; vLLM's own data parallelism opens coordination ports and {_GPUS}"
       for n in VLLM_FLAGS if n.startswith(("data_parallel_", "dp_supervisor_"))},
}

SGLANG_REFUSED: dict[str, str] = {
    "model_path": "rlkit sets the model (sglang.model_path, or actor.path)",
    "model": "rlkit sets the model (sglang.model_path, or actor.path)",
    "host": _OWN_ADDRESS,
    "port": _OWN_ADDRESS,
    **dict.fromkeys(("tp_size", "tp", "tensor_parallel_size"), "rlkit sets it from allocation_mode (sglang:tN)"),
    "served_model_name": "rlkit's clients address the model by the name rlkit gives it",
    "api_key": f"{_SECRET}; rlkit passes the trial token to SGLang as its api key through a 0600 config file",
    "admin_api_key": f"{_SECRET}; with an admin key set, SGLang's weight routes would stop accepting the trial token",
    "config": f"rlkit passes the trial token through its own --config file (SGLang takes one); {_CONFIG_FILE}",
    "grpc_mode": "serves gRPC instead of HTTP, and the guard check and rlkit's clients use HTTP",
    "smg_grpc_mode": "serves gRPC instead of HTTP, and the guard check and rlkit's clients use HTTP",
    "grpc_port": _OPENS_LISTENER,
    "use_ray": "starts a Ray cluster with listeners of its own",
    "encoder_only": "serves the encoder-disaggregation server instead of the HTTP server rlkit uses",
    "enable_dp_attention": f"moves SGLang's internal queues onto TCP ports and {_GPUS}",
    **dict.fromkeys(("dp_size", "dp", "data_parallel_size"), f"{_DP}; {_GPUS}"),
    **dict.fromkeys(("pp_size", "pp", "pipeline_parallel_size"), _GPUS),
    **dict.fromkeys(("nnodes", "node_rank", "dist_init_addr"), _NO_MULTI_NODE),
    **dict.fromkeys(("disaggregation_mode", "disaggregation_bootstrap_port"), _OPENS_LISTENER),
    "kv_events_config": f"publishes KV-cache events on a ZMQ socket: {_OPENS_LISTENER}",
    **dict.fromkeys(
        ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "ssl_keyfile_password", "enable_ssl_refresh"), _GUARD_HTTP
    ),
}

# Options rlkit renders from its own config fields: an extra_args entry would silently override the field.
VLLM_FIELD_OPTIONS: dict[str, str] = {
    name: f"vllm.{name}"
    for name in ("seed", "dtype", "max_model_len", "gpu_memory_utilization", "max_num_seqs", "enforce_eager",
                 "enable_prefix_caching")
}
SGLANG_FIELD_OPTIONS: dict[str, str] = {
    name: f"sglang.{name}"
    for name in ("random_seed", "dtype", "context_length", "mem_fraction_static", "disable_radix_cache")
}


def option_names(extra_args: Iterable[object]) -> set[str]:
    """The option names of `<backend>.extra_args` as the servers read them (dashes or underscores, any case)."""
    return {str(k).replace("-", "_").lower() for k in extra_args}


def owned_option_problems(backend: str, extra_args: Iterable[object], owned: tuple[str, ...],
                          fix: str) -> list[tuple[str, str]]:
    """(message, fix) for each option in `owned` (options rlkit sets itself when a feature is on) that
    `<backend>.extra_args` also gives, in `owned`'s order."""
    given = option_names(extra_args)
    return [(f"{backend}.extra_args.{option}: rlkit sets it itself when actor.use_lora",
             f"remove {option} from {backend}.extra_args ({fix})") for option in owned if option in given]


def extra_args_problems(backend: str, extra_args: Mapping[str, object]) -> list[Problem]:
    """Every problem with `<backend>.extra_args` (all of them, not the first), as (field, message with its fix).

    An empty list means every entry is an option rlkit passes through. `backend` is "vllm" or "sglang".
    """
    if backend not in ("vllm", "sglang"):
        raise ValueError(f"unknown server backend {backend!r}")
    refused = VLLM_REFUSED if backend == "vllm" else SGLANG_REFUSED
    fields = VLLM_FIELD_OPTIONS if backend == "vllm" else SGLANG_FIELD_OPTIONS
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    for key, value in extra_args.items():
        clean = isinstance(key, str) and _NAME.fullmatch(key) is not None
        field = f"{backend}.extra_args.{key if clean else repr(key)}"
        if not isinstance(key, str) or not clean:
            problems.append((field, f"{key!r} is not an option name: write it like max_model_len, without dashes "
                                    "in front, spaces or other characters"))
            continue
        name = key.replace("-", "_").lower()
        if name in seen:
            problems.append((field, f"the same option as {backend}.extra_args.{seen[name]}; keep one of them"))
            continue
        seen[name] = key
        message = _name_problem(backend, name, refused, fields)
        if message is None:
            message = _value_problem(name, value)
        if message is not None:
            problems.append((field, message))
    return problems


def _name_problem(backend: str, name: str, refused: Mapping[str, str], fields: Mapping[str, str]) -> str | None:
    flag = "--" + name.replace("_", "-")
    positive = name[3:] if name.startswith("no_") else name
    if positive in fields:
        return f"{flag} is set from {fields[positive]}; set {fields[positive]} instead"
    if name in refused:
        return f"{flag} is refused: {refused[name]}; remove it"
    if backend == "vllm" and name not in VLLM_FLAGS:
        allowed = sorted(VLLM_FLAGS - refused.keys() - fields.keys())
        longer = [f"--{other.replace('_', '-')}" for other in sorted(VLLM_FLAGS) if other.startswith(name)]
        prefix = f", only a prefix of {longer[0]}, which vLLM's parser would take it for" if longer else ""
        close = difflib.get_close_matches(name, allowed, n=1)
        hint = f"did you mean {close[0]}?" if close else "check the spelling"
        return (f"{flag} is not an option of vLLM {VLLM_FLAGS_VERSION}{prefix}; {hint} "
                "(python -m vllm.entrypoints.openai.api_server --help=all lists the options)")
    taken = {**refused, **{option: f"it is set from {field}" for option, field in fields.items()}}
    whole = sorted(other for other in taken if other.startswith(name) and other != name)
    if whole:
        return (f"{flag} is a prefix of --{whole[0].replace('_', '-')}, and SGLang's parser takes an unambiguous "
                f"prefix for the whole option, which is refused: {taken[whole[0]]}; remove it")
    return None


def _value_problem(name: str, value: object) -> str | None:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if name == "middleware" and not all(isinstance(v, str) and _IMPORT_PATH.fullmatch(v) for v in items):
        return "middleware takes import paths of ASGI middlewares (package.module.Class), one or a list"
    for item in items:
        if isinstance(value, (list, tuple)) and (item is None or isinstance(item, (list, tuple))):
            return f"a list item {item!r} cannot be one command-line value; give plain values or one mapping each"
        if item is not None and not isinstance(item, (bool, int, float, str, PurePath, Mapping)):
            return f"a value of type {type(item).__name__} cannot go on a command line; give text, a number or a list"
        if isinstance(item, str) and item.startswith("-") and not _NUMBER.fullmatch(item):
            return f"the value {item!r} starts with '-', so the server's parser would read it as another option"
    return None
