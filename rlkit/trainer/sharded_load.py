"""Building a trained (or frozen) model so that no rank ever holds it whole on its device, and only rank 0 in host
memory: every rank builds the model's skeleton on the meta device, FSDP2-shards it and allocates its own shards;
rank 0 alone builds the full model on the CPU and its weights are broadcast into every rank's shards, a tensor at a
time (torch.distributed.checkpoint's set_model_state_dict with broadcast_from_rank0).

One builder makes both: `build(device)` is the model factory of today (rlkit.trainer.engine: the causal LM, its LoRA
wrapping, value head, gradient checkpointing), called once with the meta device (the skeleton: same modules, same
ties, no values) and once, on rank 0, with the CPU (the initial values, exactly as before: the checkpoint's weights,
the seeded adapter and head, init_from_scratch's seeded draw). Without this, each of 8 ranks of a node held the
whole float32 model in host memory and then on its GPU before sharding (a 7B model: 28 GB each; a 32B one fits no
80 GB GPU at all).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

META = torch.device("meta")
HOST = torch.device("cpu")


def shard_model(model: nn.Module, *, param_dtype: torch.dtype | None) -> nn.Module:
    """fully_shard every decoder layer (found through a peft wrapper too), then the whole model (FSDP2)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from rlkit.trainer.lora import decoder_layers

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else None
    kwargs: dict[str, Any] = {"mp_policy": mp} if mp is not None else {}
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def build_sharded(build: Callable[[torch.device], nn.Module], device: torch.device, *,
                  param_dtype: torch.dtype | None, prepare: Callable[[nn.Module], Any] | None = None) -> nn.Module:
    """The model of `build`, FSDP2-sharded on `device` with rank 0's full model's values; collective (every rank of
    the default process group). `prepare` runs on the skeleton before sharding (a frozen reference: no gradients,
    eval mode)."""
    import torch.distributed as dist

    def built(where: torch.device) -> nn.Module:
        model = build(where)
        if prepare is not None:
            prepare(model)
        return model

    model = shard_model(built(META), param_dtype=param_dtype)
    model.to_empty(device=device)  # this rank's shards (and whole buffers), uninitialised
    full = built(HOST) if dist.get_rank() == 0 else None  # host memory of rank 0 only, never its device
    load_full(model, full)
    del full
    gc.collect()  # rank 0's full copy goes now, not at some later collection
    return model


def load_full(model: nn.Module, full: nn.Module | None) -> None:
    """Every rank's shards of `model` set from `full` (rank 0's whole model, None elsewhere); collective.

    Parameters and persistent buffers go through the state dict (strict: the skeleton and the full model have the
    same names); non-persistent buffers (the rotary embedding's inv_freq: computed at build time, in no state dict)
    are broadcast from rank 0 too, since to_empty left them uninitialised; so are the modules' training flags
    (from_pretrained leaves a model in eval mode, a model built from its config in training mode)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full_sd = full.state_dict() if full is not None else {}
    set_model_state_dict(model, full_sd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del full_sd
    with torch.no_grad():
        for name, buffer in non_persistent_buffers(model):
            if full is not None:
                buffer.copy_(full.get_buffer(name))
            dist.broadcast(buffer, src=0)
    modes = [[module.training for module in full.modules()] if full is not None else None]
    dist.broadcast_object_list(modes, src=0)
    for module, training in zip(model.modules(), modes[0] or [], strict=True):
        module.training = training
    left = [name for name, tensor in _tensors(model) if tensor.is_meta]
    if left:
        raise RuntimeError(f"the sharded model still has tensors on the meta device after loading: {left}")


def non_persistent_buffers(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, buffer) of every buffer in no state dict, in module order (the same on every rank)."""
    for prefix, module in model.named_modules():
        for name, buffer in module.named_buffers(recurse=False):
            if name in module._non_persistent_buffers_set:
                yield (f"{prefix}.{name}" if prefix else name), buffer


def _tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from model.named_parameters()
    yield from model.named_buffers()
