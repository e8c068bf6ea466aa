"""Mean/std normalisation at batch or group level, with AReaL's semantics (used by reward_norm and adv_norm).

Semantics follow AReaL's `Normalization` (areal/utils/data.py at 4aef98d8):
- the std is taken around the mean that was actually subtracted (the batch mean, a group mean, a leave-one-out
  mean, or 0 with no centring), so a flat group under `mean_level=batch, std_level=group` is finite;
- `eps` is added to the std, and only when a std is divided by;
- statistics are weighted by `mask` (tokens) when one is given, and computed in float64;
- an unbiased std over one element is 1 (nothing to estimate from), as is the std of a fully masked slice.
"""

from __future__ import annotations

import torch
from torch import Tensor

LEVELS = ("batch", "group", None)


def canonical_level(level: str | None) -> str | None:
    """'none' (rlkit's older spelling) and None both mean: skip this step."""
    return None if level in (None, "none") else level


def normalize(
    x: Tensor,
    mask: Tensor | None = None,
    *,
    mean_level: str | None = "batch",
    std_level: str | None = "batch",
    group_size: int = 1,
    mean_leave1out: bool = False,
    std_unbiased: bool = True,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise `x` ([B] sequence values or [B, T] token values); groups are `group_size` consecutive rows.

    Returns float32 values, zero where `mask` is 0.
    """
    mean_level, std_level = canonical_level(mean_level), canonical_level(std_level)
    for name, level in (("mean_level", mean_level), ("std_level", std_level)):
        if level not in LEVELS:
            raise ValueError(f"{name} must be batch, group or None, got {level!r}")
    if mask is not None and mask.shape != x.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {tuple(x.shape)}")
    bs = x.shape[0]
    if "group" in (mean_level, std_level) and (group_size < 1 or bs % group_size):
        raise ValueError(f"group_size {group_size} does not divide the {bs} rows")
    if mask is not None and not bool(mask.any()):
        return x.float()
    xd = x.to(torch.float64)
    md = torch.ones_like(xd) if mask is None else mask.to(torch.float64)

    def slices(level: str) -> list[slice]:
        return [slice(0, bs)] if level == "batch" else [slice(i, i + group_size) for i in range(0, bs, group_size)]

    mean = torch.zeros_like(xd)
    if mean_level is not None:
        for s in slices(mean_level):
            mean[s] = _mean(xd[s], md[s], leave1out=mean_leave1out, group_of_one=mean_level == "group"
                            and group_size == 1)
    centred = (xd - mean) * md
    std = torch.ones_like(xd)
    if std_level is not None:
        for s in slices(std_level):
            if std_level == "group" and group_size == 1 and std_unbiased:
                continue  # AReaL: a group of one has std 1
            std[s] = _std(xd[s], md[s], mean[s], unbiased=std_unbiased)
    else:
        eps = 0.0
    return (centred / (std + eps)).float()


def _mean(x: Tensor, m: Tensor, *, leave1out: bool, group_of_one: bool) -> Tensor:
    """The (masked) mean of `x`, broadcast to its shape; leave-one-out: every masked element's mean of the rest."""
    if group_of_one and leave1out:
        return torch.zeros_like(x)
    count = m.sum()
    total = (x * m).sum()
    if leave1out:
        if count <= 1:
            return torch.zeros_like(x)
        loo = (total - x * m) / (count - m).clamp(min=1.0)
        return torch.where(m > 0, loo, total / count)
    if count == 0:
        return torch.zeros_like(x)
    return (total / count).expand_as(x)


def _std(x: Tensor, m: Tensor, mean: Tensor, *, unbiased: bool) -> Tensor:
    """The (masked) std of `x` around the given per-element `mean`, broadcast to its shape."""
    count = m.sum()
    sq = ((x - mean) * m).square().sum()
    if unbiased:
        value = (sq / (count - 1)).sqrt() if count > 1 else torch.ones((), dtype=x.dtype)
    else:
        value = (sq / count).sqrt() if count > 0 else torch.ones((), dtype=x.dtype)
    return value.expand_as(x)
