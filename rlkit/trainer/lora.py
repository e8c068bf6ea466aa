"""LoRA with peft on the trainer: wrap the causal LM before FSDP shards it, gather only the adapter, write it in the
format vLLM's runtime LoRA loader reads (a peft directory: rlkit.weights.adapter_files).

Only the adapter's parameters train (peft freezes the base), so the optimizer, the gathers of a weight push and the
directory the servers load are all adapter-sized. The base weights on the servers never change in a LoRA run: each
weight version is a new adapter, loaded under a new name (rlkit.weights.lora_disk).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from rlkit.weights.adapter_files import LORA_MARK, is_adapter_param, lora_config, write_adapter

if TYPE_CHECKING:
    from rlkit.config.schema.actor import ActorConfig

ADAPTER_NAME = "default"  # peft's name for the one adapter a model gets; peft drops it from the saved names
LORA_INIT_SEED = 0


def wrap_lora(model: nn.Module, actor: ActorConfig) -> nn.Module:
    """The peft model around `model` (call BEFORE sharding, on every rank): the base is frozen, each target module
    gets A (random) and B (zeros), so the wrapped model starts out computing exactly what the base does (what the
    servers serve before the first adapter).

    A is drawn from a fixed seed, whatever the process's RNG state: FSDP keeps each rank's own slice of the tensor
    it is given, so ranks that drew different A's would train a patchwork of them."""
    from peft import get_peft_model

    if actor.peft_type != "lora":
        raise ValueError(f"actor.peft_type {actor.peft_type!r}: only lora is supported")
    base_path = getattr(getattr(model, "config", None), "_name_or_path", None) or None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(LORA_INIT_SEED)
        return get_peft_model(model, lora_config(actor, base_model=base_path))


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a causal LM, through a peft wrapper too: the units FSDP shards one by one."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    layers = getattr(getattr(base, "model", base), "layers", None)
    return list(layers) if layers is not None else []


def iter_adapter_buckets(model: nn.Module, dtype: torch.dtype | None = None) -> Iterator[dict[str, Tensor] | None]:
    """Collective (every FSDP rank, in step): gather each adapter parameter in full, in `named_parameters` order;
    yields ONE bucket, on rank 0 `{peft save name: tensor on the CPU}` (the names of adapter_model.safetensors), on
    the other ranks None. The shape of `TrainEngine.iter_full_buckets`, so a weight transport consumes it the same
    way."""
    from peft.utils import get_peft_model_state_dict

    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    gathered: dict[str, Tensor] = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not is_adapter_param(name):
                continue
            full = param.full_tensor() if hasattr(param, "full_tensor") else param.detach()  # DTensor: all-gather
            if rank == 0:
                gathered[name] = full.to("cpu", dtype=dtype or full.dtype).contiguous()
    if rank != 0:
        yield None
        return
    if not gathered:
        raise ValueError("the model has no LoRA parameters: was it wrapped with rlkit.trainer.lora.wrap_lora?")
    named = get_peft_model_state_dict(model, state_dict=gathered, adapter_name=ADAPTER_NAME,
                                      save_embedding_layers=False)
    yield {name: tensor.contiguous() for name, tensor in named.items()}


def export_adapter(model: nn.Module, actor: ActorConfig, base_model: str, out_dir: Path) -> Path | None:
    """Collective: gather the adapter of the (FSDP-sharded) peft model and write it to `out_dir` on rank 0 (the
    path; None on the other ranks)."""
    path: Path | None = None
    for bucket in iter_adapter_buckets(model):
        if bucket is not None:
            path = write_adapter(bucket, actor, base_model, out_dir)
    return path


_PEFT_ROOT = "base_model.model."
ADAPTER_DIR = "adapter"  # a LoRA run's saved checkpoint: the merged model, and its adapter in this subdirectory


def adapter_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The adapter's tensors of a peft model's FULL state dict, under the names peft saves them by (the adapter name
    dropped: `...q_proj.lora_A.weight`), what `write_adapter` takes."""
    renamed = {f".lora_{ab}.{ADAPTER_NAME}.": f".lora_{ab}." for ab in "AB"}
    adapter: dict[str, Tensor] = {}
    for key, tensor in state.items():
        if is_adapter_param(key):
            for old, new in renamed.items():
                key = key.replace(old, new)
            adapter[key] = tensor
    return adapter


def merge_adapter_state(state: dict[str, Tensor], actor: ActorConfig) -> dict[str, Tensor]:
    """The plain causal LM's weights (Hugging Face names) with the adapter merged in: W + (lora_alpha / lora_rank) *
    B @ A for every adapted module, from the peft model's FULL state dict (`TrainEngine.full_state_dict()` on rank
    0). What a saved checkpoint must hold to be a model on its own (the next stage's `actor.path`, a server's
    `--model`), since the servers' adapter needs the base beside it."""
    scale = actor.lora_alpha / actor.lora_rank
    merged: dict[str, Tensor] = {}
    lora: dict[str, dict[str, Tensor]] = {}
    for key, tensor in state.items():
        name = key.removeprefix(_PEFT_ROOT)
        if LORA_MARK in name:
            module, rest = name.split(LORA_MARK, 1)
            lora.setdefault(module, {})[rest.split(".", 1)[0]] = tensor  # "A" or "B"
        else:
            merged[name.replace(".base_layer.", ".")] = tensor
    for module, pair in lora.items():
        if set(pair) != {"A", "B"}:
            raise ValueError(f"{module}: LoRA parameters {sorted(pair)} found, need A and B")
        weight = f"{module}.weight"
        base = merged[weight]
        delta = (pair["B"].float() @ pair["A"].float()) * scale
        merged[weight] = (base.float() + delta).to(base.dtype)
    return merged
