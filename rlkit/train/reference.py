"""The frozen reference model of a KL term (or of DPO): the initial weights, sharded like the trained model, never
stepped. With LoRA there is no second model: the trained peft model with its adapter switched off is the base."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from rlkit.config.schema_actor import ActorConfig
from rlkit.train.engine import load_causal_lm, param_dtype_of, shard_model


def needs_reference(actor: ActorConfig) -> bool:
    """Whether the run computes reference log-probs (one place, so a new KL knob is a one-line change)."""
    return actor.kl_ctl > 0 or actor.kl_loss_coef > 0  # the KL reward penalty, the KL loss term


def frozen_reference(actor: ActorConfig, device: torch.device, path: str = "") -> nn.Module:
    """The causal LM at `path` (empty: actor.path), sharded with the trained model's compute dtype, in eval mode
    without gradients; collective (FSDP)."""
    ref = load_causal_lm(path or actor.path, dtype=torch.float32, attn_impl=actor.attn_impl).to(device)
    ref.requires_grad_(False).eval()
    return shard_model(ref, param_dtype=param_dtype_of(actor))


@contextlib.contextmanager
def adapter_off(model: nn.Module) -> Iterator[nn.Module]:
    """The (FSDP-sharded) peft model computing as its frozen base, peft's disable_adapter: the reference of a LoRA run
    without a second copy of the base in memory. Local to each rank (no collective)."""
    with model.disable_adapter():  # type: ignore[operator]
        yield model
