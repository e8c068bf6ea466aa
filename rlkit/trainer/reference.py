"""The frozen reference model of a KL term (or of DPO): ref.path's weights (dpo: dpo.ref_path when set; neither set:
actor.path, the initial weights), sharded like the trained model, in eval mode, never stepped. With LoRA and no other
model named there is no second model: the trained peft model with its adapter switched off is the base
(rlkit.config.reference.separate_reference decides)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from rlkit.config.reference import reference_load, separate_reference
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.schema.ref import ReferenceLoad
from rlkit.models.dtypes import DTYPES
from rlkit.models.packing import set_packing
from rlkit.trainer import out_of_memory
from rlkit.trainer.engine import load_causal_lm
from rlkit.trainer.sharded_load import build_sharded


def frozen_reference(load: ReferenceLoad, device: torch.device) -> nn.Module:
    """The causal LM at `load.path`, sharded with `load.dtype` as its compute dtype (parameters kept in float32 like
    the trained model's), in eval mode without gradients; collective (FSDP; built as rlkit.trainer.sharded_load
    builds the trained model: never whole on a device, each rank reading its own rows of load.path's safetensors
    where they are exactly the model's weights)."""
    def build(where: torch.device) -> nn.Module:
        return load_causal_lm(load.path, dtype=torch.float32, attn_impl=load.attn_impl, meta=where.type == "meta")

    dtype = DTYPES[load.dtype]
    model = build_sharded(build, device, param_dtype=None if dtype == torch.float32 else dtype,
                          prepare=lambda ref: ref.requires_grad_(False).eval(), checkpoint=load.path)
    out_of_memory.watch(model, out_of_memory.REFERENCE)  # what ran, for the message of an out-of-memory
    return model


def reference_model(config: ExperimentConfig, device: torch.device) -> nn.Module | None:
    """The job's frozen reference as a model of its own, or None when it is the LoRA base (`adapter_off` of the
    trained model); collective (FSDP)."""
    if not separate_reference(config):
        return None
    model = frozen_reference(reference_load(config), device)
    set_packing(model, config.actor.mb_spec.packing)
    return model


@contextlib.contextmanager
def adapter_off(model: nn.Module) -> Iterator[nn.Module]:
    """The (FSDP-sharded) peft model computing as its frozen base, peft's disable_adapter: the reference of a LoRA run
    without a second copy of the base in memory. Local to each rank (no collective)."""
    with model.disable_adapter():  # type: ignore[operator]
        yield model
