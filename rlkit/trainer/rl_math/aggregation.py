"""How per-token loss values become one loss (actor.loss_agg_mode, verl's loss_agg_mode): a mean over units, tokens
or sequences, so that the engine can weight each micro-batch by its units (rlkit.trainer.engine.optimizer_step) and
the gradient is the mean over the minibatch's units of every micro-batch and rank.

- token-mean: every trained token weighs the same (DAPO; rlkit's default). Units: tokens.
- seq-mean-token-mean: each sequence's token-mean, then the mean over sequences (the GRPO paper). Units: sequences.
- seq-mean-token-sum: each sequence's token-sum, then the mean over sequences. Units: sequences.
- seq-mean-token-sum-norm: each sequence's token-sum over a constant (`scale_factor`, rlkit: gconfig.max_new_tokens
  unless actor.loss_scale_factor), then the mean over sequences (Dr.GRPO: no length bias). Units: sequences.

A sequence is a row of the [B, T] tensors (one sample; rows are right-padded) with at least one trained token: a
filler row (all of its mask False) or a sample whose tokens are all masked counts in neither numerator nor units.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.config.schema.actor import LOSS_AGG_MODES


def loss_units(mask: Tensor, mode: str) -> int:
    """The units a micro-batch's loss is a mean over: its trained tokens (token-mean) or its rows with at least one
    trained token (the seq-mean modes)."""
    _check_mode(mode)
    mask = mask.bool()
    return int(mask.sum()) if mode == "token-mean" else int(mask.any(dim=-1).sum())


def aggregate(values: Tensor, mask: Tensor, mode: str, *, scale_factor: float | None = None) -> tuple[Tensor, int]:
    """(loss, units): `values` [B, T] reduced over `mask` [B, T] as `mode` says, a mean over `units` (0 units: a zero
    loss that still carries the graph). `scale_factor` is seq-mean-token-sum-norm's constant (required there)."""
    _check_mode(mode)
    if values.shape != mask.shape or values.dim() != 2:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} must both be [rows, tokens]")
    mask = mask.bool()
    masked = torch.where(mask, values, 0.0)
    if mode == "token-mean":
        return masked.sum() / mask.sum().clamp(min=1), int(mask.sum())
    counts = mask.sum(dim=-1)
    rows = counts > 0
    per_row = masked.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        per_row = per_row / counts.clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        if scale_factor is None or not scale_factor > 0:
            raise ValueError(f"seq-mean-token-sum-norm needs a positive scale_factor, got {scale_factor}")
        per_row = per_row / scale_factor
    units = int(rows.sum())
    return torch.where(rows, per_row, 0.0).sum() / max(1, units), units


def _check_mode(mode: str) -> None:
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {', '.join(LOSS_AGG_MODES)}, got {mode!r}")
