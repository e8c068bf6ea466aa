"""LoRA adapters on SGLang 0.5.23 servers (`actor.use_lora`): the launch options and the adapter routes.

Read in SGLang 0.5.23's source and run against a real SGLang 0.5.23 server on the CPU
(tests/integration/test_sglang_lora.py, with a test-only pin_memory shim: SGLang's LoRA code pins host memory,
which torch refuses without CUDA):
- launch (`arg_groups/fields/lora.py`, `arg_groups/lora_hook.py`): `--enable-lora`; with no adapter at start
  (`--lora-paths`) SGLang needs both `--max-lora-rank` and `--lora-target-modules` (the union of the modules any
  adapter may adapt; `all` for every one it supports). `--max-loras-per-batch` (default 8, counting the base model)
  and `--max-loaded-loras` (default: no bound) are left to SGLang: rlkit holds two adapters at a time. The default
  `--lora-backend csgmv` is a Triton kernel; a server without CUDA gets `torch_native` unless
  `sglang.extra_args.lora_backend` says otherwise.
- `POST /load_lora_adapter {"lora_name", "lora_path"}` and `POST /unload_lora_adapter {"lora_name"}`
  (io_struct.LoadLoRAAdapterReqInput / UnloadLoRAAdapterReqInput) answer `{"success", "error_message",
  "loaded_adapters"}`, HTTP 400 when not `success` (an unknown name on unload: "LoRA with name X does not exist").
  An unload removes the name at once (new requests naming it are refused) and then WAITS until the requests already
  running with it finish (TokenizerManager._unload_lora_adapter_locked: `lora_registry.wait_for_unload`).
- `GET /v1/models`: the base model, then one card per loaded adapter, with `parent` set.
- `/generate` names the adapter by its name in `lora_path` (GenerateReqInput; a string applies to every prompt of a
  batch and every sample of `n`); a name never loaded is refused (HTTP 400). Unlike vLLM, a name that was loaded
  and then UNLOADED is not refused: SGLang remembers every name with its path (TokenizerManager.lora_ref_cache, no
  route forgets it) and loads it again for the request (`_resolve_lora_path`, "Reloading evicted adapter"). For
  rlkit that is a late request of the previous version served by the previous version's adapter (the transport
  keeps that directory; an older one is gone and the request fails); the next push unloads it again with the
  run's other old names (rlkit.weights.lora_disk.deliver_one).
- Each load gets a fresh `lora_id` (a uuid4, LoRARef) that the radix cache keys the adapter's KV by
  (Req.extra_key), so a name loaded again never finds KV of the adapter it had before: no cache flush is needed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.errors import StepError
from rlkit.servers.backend import Server
from rlkit.servers.extra_args import option_names
from rlkit.servers.http import ServerUnreachable, answer_json, answer_object, call

if TYPE_CHECKING:
    import httpx

# What lora_flags sets (sglang.extra_args must not), and the target modules SGLang 0.5.23 takes (`--lora-target-modules`
# choices, sglang.srt.utils.common.SUPPORTED_LORA_TARGET_MODULES, of dense models; all-linear goes as SGLang's `all`).
LORA_OPTIONS = ("enable_lora", "max_lora_rank", "lora_target_modules")
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "gate_proj", "up_proj", "down_proj", "gate_up_proj",
                "all-linear")
CPU_LORA_BACKEND = "torch_native"  # SGLang's only LoRA kernels that run without CUDA (lora/backend/torch_backend.py)


def lora_flags(lora_rank: int, target_modules: Sequence[str], extra: Mapping[str, object]) -> list[str]:
    """The options an SGLang server needs to load rank-`lora_rank` adapters of `target_modules` at run time;
    `--lora-backend torch_native` on a machine without CUDA unless `sglang.extra_args` (`extra`) names a backend."""
    modules = ["all"] if list(target_modules) == ["all-linear"] else list(target_modules)
    args = ["--enable-lora", "--max-lora-rank", str(lora_rank), "--lora-target-modules", *modules]
    if "lora_backend" not in option_names(extra) and not _has_cuda():
        args += ["--lora-backend", CPU_LORA_BACKEND]
    return args


def _has_cuda() -> bool:
    from rlkit.servers.cuda_probe import cuda_available

    return cuda_available()


async def load(client: httpx.AsyncClient, server: Server, name: str, adapter_dir: Path, version: int,
               timeout: float) -> dict[str, Any]:
    """`POST /load_lora_adapter`, then `POST /update_weight_version {"new_version", "abort_all_requests": false}`
    (its default would abort every request). SGLang reads and checks the adapter while loading (a rank above
    --max-lora-rank, a module outside --lora-target-modules, an unreadable path are refused here). Returns
    `{"seconds": {"load_adapter": s, "set_version": s}, "loaded": [names]}`."""
    started = time.monotonic()
    what = f"loading LoRA adapter {name!r} from {adapter_dir}"
    try:
        response = await call(client, server, "POST", "/load_lora_adapter", what, timeout,
                              json={"lora_name": name, "lora_path": str(adapter_dir)})
    except ServerUnreachable:
        raise
    except StepError as exc:
        raise StepError(f"{exc}\n  fix: the server must run with --enable-lora, a --max-lora-rank of at least "
                        "actor.lora_rank and --lora-target-modules covering actor.target_modules (rlkit adds them "
                        "when actor.use_lora), and be able to read the directory") from exc
    answer = answer_json(response, server, what)
    if not isinstance(answer, dict) or answer.get("success") is not True:
        raise StepError(f"{server.label}: {what} (/load_lora_adapter) answered {response.text[:500]}")
    loaded = time.monotonic()
    what = f"setting the weight version to {version}"
    response = await call(client, server, "POST", "/update_weight_version", what, timeout,
                          json={"new_version": str(version), "abort_all_requests": False})
    if answer_object(response, server, what).get("success") is not True:
        raise StepError(f"{server.label}: {what} (/update_weight_version) answered {response.text[:500]}")
    return {"seconds": {"load_adapter": loaded - started, "set_version": time.monotonic() - loaded},
            "loaded": sorted(answer.get("loaded_adapters") or {})}


async def unload(client: httpx.AsyncClient, server: Server, name: str, timeout: float) -> bool:
    """`POST /unload_lora_adapter`: returns once the requests still running with the adapter finished (SGLang waits
    for them); False when the server has no adapter of that name. A later request naming it loads it again (see the
    module docstring)."""
    what = f"unloading LoRA adapter {name!r}"
    try:
        response = await call(client, server, "POST", "/unload_lora_adapter", what, timeout, json={"lora_name": name})
    except ServerUnreachable:
        raise
    except StepError as exc:
        if "HTTP 400" in str(exc) and "does not exist" in str(exc):
            return False
        raise
    answer = answer_json(response, server, what)
    if not isinstance(answer, dict) or answer.get("success") is not True:
        raise StepError(f"{server.label}: {what} (/unload_lora_adapter) answered {response.text[:500]}")
    return True


async def listed(client: httpx.AsyncClient, server: Server, timeout: float) -> list[str]:
    """`GET /v1/models`: the adapters' cards are the ones with a `parent` (the base model's has none)."""
    response = await call(client, server, "GET", "/v1/models", "the model list", timeout)
    cards = answer_object(response, server, "the model list").get("data") or []
    return [str(card["id"]) for card in cards if isinstance(card, dict) and card.get("parent")]
