"""The PPO critic's loss (pure torch): a clipped value loss, averaged over the masked tokens.

Semantics as in AReaL's critic loss and verl's compute_value_loss: per token, the larger of 0.5 (v - R)^2 and
0.5 (v_clip - R)^2, where v_clip is the new value v moved at most `eps_clip` from the value at rollout time. The
max keeps the update pessimistic: once a value has moved past the clip range in the direction that helps, its loss
no longer pulls further. Returns R come from GAE (rlkit.trainer's advantage code), never from here.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor


def ppo_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, loss_mask: Tensor, *, eps_clip: float,
                   reduction: Literal["mean", "sum"] = "mean") -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss, token mean over `loss_mask` (0 with no token, still part of the graph), or the sum over
    the masked tokens (for a caller that divides by a count over all ranks); all inputs of one shape. Metrics
    (detached, over the masked tokens): loss (the mean), clip_fraction (share of tokens whose clipped loss was the
    larger one, so the clip decided), the mean new value and the mean return."""
    if not values.shape == old_values.shape == returns.shape == loss_mask.shape:
        raise ValueError(f"shapes differ: values {tuple(values.shape)}, old_values {tuple(old_values.shape)}, "
                         f"returns {tuple(returns.shape)}, loss_mask {tuple(loss_mask.shape)}")
    if eps_clip < 0:
        raise ValueError(f"eps_clip must be >= 0, got {eps_clip}")
    v, old, ret = values.float(), old_values.detach().float(), returns.detach().float()
    mask = loss_mask.bool()
    unclipped = 0.5 * (v - ret).square()
    v_clipped = old + (v - old).clamp(-eps_clip, eps_clip)
    clipped = 0.5 * (v_clipped - ret).square()
    per_token = torch.maximum(unclipped, clipped)
    count = mask.sum()
    total = torch.where(mask, per_token, 0.0).sum()
    loss = total if reduction == "sum" else total / count.clamp(min=1)
    with torch.no_grad():
        n = count.clamp(min=1).float()
        stats = {"loss": total.detach() / n, "clip_fraction": ((clipped > unclipped) & mask).sum() / n,
                 "value": torch.where(mask, v, 0.0).sum() / n, "return": torch.where(mask, ret, 0.0).sum() / n,
                 "tokens": count.float()}
    return loss, stats
