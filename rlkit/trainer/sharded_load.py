"""Building a trained (or frozen) model so that no rank ever holds it whole on its device, and at most rank 0 in host
memory: every rank builds the model's skeleton on the meta device, FSDP2-shards it and allocates its own shards;
rank 0 alone builds the full model on the CPU and its weights are broadcast into every rank's shards, a tensor at a
time (torch.distributed.checkpoint's set_model_state_dict with broadcast_from_rank0).

One builder makes both: `build(device)` is the model factory of today (rlkit.trainer.engine: the causal LM, its LoRA
wrapping, value head, gradient checkpointing), called once with the meta device (the skeleton: same modules, same
ties, no values) and once, on rank 0, with the CPU (the initial values, exactly as before: the checkpoint's weights,
the seeded adapter and head, init_from_scratch's seeded draw). Without this, each of 8 ranks of a node held the
whole float32 model in host memory and then on its GPU before sharding (a 7B model: 28 GB each; a 32B one fits no
80 GB GPU at all).

When the weights are the checkpoint's (`checkpoint`: the plain causal LM, LoRA's base, the value model's backbone, the
frozen reference), rank 0 does not build the full model either: each rank reads its own rows of every tensor from the
safetensors (rlkit.trainer.checkpoint_slices), takes what the build draws itself (LoRA's adapter, a fresh value head)
from its own meta build (rlkit.trainer.fresh_params), and rank 0 sends only what no checkpoint holds (the non-persistent
buffers, the training flags) from a skeleton of its own (a 70B model: no 280 GB on rank 0's host). Where that would not
be exactly from_pretrained's model (renamed keys, a dtype that does not cast exactly, ...), one line on rank 0 says why
and the full model is broadcast as above.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from rlkit.trainer.checkpoint_slices import Slice, load_slices, slice_plan
from rlkit.trainer.fresh_params import FreshCapture

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
                  param_dtype: torch.dtype | None, prepare: Callable[[nn.Module], Any] | None = None,
                  checkpoint: str | None = None) -> nn.Module:
    """The model of `build`, FSDP2-sharded on `device` with rank 0's full model's values; collective (every rank of
    the default process group). `prepare` runs on the skeleton before sharding (a frozen reference: no gradients,
    eval mode). `checkpoint`: the directory whose safetensors are exactly `build(cpu)`'s weights (from_pretrained's,
    in float32) but those the meta build draws as `build(cpu)` does: each rank then reads its own shards there and
    takes the drawn ones from its own skeleton instead."""
    import torch.distributed as dist

    def built(where: torch.device) -> nn.Module:
        model = build(where)
        if prepare is not None:
            prepare(model)
        return model

    with FreshCapture() as capture:
        skeleton = built(META)
    fresh = capture.values(skeleton) if checkpoint is not None else {}  # what the build drew itself (LoRA's A, B)
    capture.clear()
    decision: list[Any] = [None]  # rank 0's: the plan of each rank's reads, or why there is none
    source = None
    if checkpoint is not None:
        if dist.get_rank() == 0:
            source, decision[0] = _decide(skeleton, checkpoint, lambda: built(META), fresh)
        dist.broadcast_object_list(decision, src=0)
    model = shard_model(skeleton, param_dtype=param_dtype)
    model.to_empty(device=device)  # this rank's shards (and whole buffers), uninitialised
    if isinstance(decision[0], list):
        load_slices(model, decision[0])
        load_fresh(model, fresh, {entry.name for entry in decision[0]})
        load_unsaved(model, source)
    else:
        full = built(HOST) if dist.get_rank() == 0 else None  # host memory of rank 0 only, never its device
        load_full(model, full)
        del full
    del source
    gc.collect()  # rank 0's full copy goes now, not at some later collection
    _check_loaded(model)
    return model


def _decide(skeleton: nn.Module, checkpoint: str, build_loaded: Callable[[], nn.Module],
            fresh: dict[str, torch.Tensor] | None = None) -> tuple[nn.Module | None, list[Slice] | str]:
    """Rank 0's (source of what the checkpoint lacks, plan of each rank's reads), or (None, why there is none: said
    in one line). Any failure here is a reason, never an exception: the other ranks wait for the decision."""
    try:
        plan = slice_plan(skeleton, checkpoint, fresh or {})
    except Exception as exc:  # a hostile index or file: the full build reports it as it would
        plan = f"its checkpoint could not be checked ({type(exc).__name__}: {exc})"
    source = None
    if not isinstance(plan, str):
        source, plan = checkpoint_source(build_loaded, plan)
    if isinstance(plan, str):
        print(f"rlkit train: rank 0 builds the whole model on its host and broadcasts it, since reading each rank's "
              f"shards from {checkpoint} would not be exactly from_pretrained's model: {plan}", flush=True)
    return source, plan


def checkpoint_source(build_loaded: Callable[[], nn.Module], plan: list[Slice]) -> tuple[nn.Module | None,
                                                                                           list[Slice] | str]:
    """(rank 0's source of what the checkpoint lacks, the plan) or (None, why there is none): the model's skeleton
    as from_pretrained leaves it (eval mode) with its non-persistent buffers on the host, computed as from_pretrained
    computes them after loading (transformers' initialize_weights; the parameters stay on the meta device)."""
    try:
        source = build_loaded()
        for name, buffer in list(non_persistent_buffers(source)):
            module, _, leaf = name.rpartition(".")
            source.get_submodule(module).register_buffer(leaf, torch.empty_like(buffer, device=HOST),
                                                         persistent=False)
        source.initialize_weights()  # type: ignore[operator]
    except Exception as exc:  # any model that cannot: the full build still can
        return None, f"its buffers could not be computed without its weights ({type(exc).__name__}: {exc})"
    return source, plan


def load_fresh(model: nn.Module, fresh: dict[str, torch.Tensor], read: set[str]) -> None:
    """This rank's part of every state-dict entry the plan does not read (`read`: the names it does) from the values
    the build drew itself (every rank's own, identical: rlkit.trainer.fresh_params); local (no collective)."""
    from rlkit.trainer.checkpoint_slices import local_part, tensor_of

    with torch.no_grad():
        for name, value in fresh.items():
            if name not in read:
                local, rows = local_part(tensor_of(model, name))
                local.copy_(value[rows])


def load_full(model: nn.Module, full: nn.Module | None) -> None:
    """Every rank's shards of `model` set from `full` (rank 0's whole model, None elsewhere); collective.

    Parameters and persistent buffers go through the state dict (strict: the skeleton and the full model have the
    same names); the rest as load_unsaved."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full_sd = full.state_dict() if full is not None else {}
    set_model_state_dict(model, full_sd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del full_sd
    load_unsaved(model, full)


def load_unsaved(model: nn.Module, source: nn.Module | None) -> None:
    """What no state dict holds, broadcast from `source` (rank 0's, None elsewhere); collective. Non-persistent
    buffers (the rotary embedding's inv_freq: computed at build time) since to_empty left them uninitialised, and the
    modules' training flags (from_pretrained leaves a model in eval mode, a model built from its config in training
    mode)."""
    import torch.distributed as dist

    with torch.no_grad():
        for name, buffer in non_persistent_buffers(model):
            if source is not None:
                buffer.copy_(source.get_buffer(name))
            dist.broadcast(buffer, src=0)
    modes = [[module.training for module in source.modules()] if source is not None else None]
    dist.broadcast_object_list(modes, src=0)
    for module, training in zip(model.modules(), modes[0] or [], strict=True):
        module.training = training


def _check_loaded(model: nn.Module) -> None:
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
