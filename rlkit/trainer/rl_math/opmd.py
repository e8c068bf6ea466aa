"""OPMD (online policy mirror descent) and the SFT term of an SFT+RL mix, as Trinity-RFT defines them, on tensors.

OPMD (Trinity-RFT's `algorithm_type: opmd`, trinity/algorithm/{advantage_fn,policy_loss_fn}/opmd_*.py): each
sequence's advantage is its reward minus its group's baseline, with no division by a std; the baseline is the group
mean ("mean") or tau * log(mean(exp(r / tau))) ("logavgexp", a soft maximum that tends to the mean as tau grows);
a group of one gets baseline 0. The loss is the mean (token-mean unless actor.loss_agg_mode) of -A * log pi over the
trained tokens, divided by (1 + tau): no ratio and no clip (the old policy is not used), tau the strength of the
mirror-descent regulariser.

The mix (Trinity-RFT's `algorithm_type: mix`, mix_policy_loss.py): (1 - mu) * the RL loss + mu * the SFT loss of
expert rows, the SFT loss the token-mean negative log-likelihood of the expert responses.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlkit.trainer.rl_math.aggregation import aggregate

OPMD_BASELINES = ("mean", "logavgexp")


def opmd_baselines(rewards: Tensor, *, baseline: str = "mean", tau: float = 1.0) -> Tensor:
    """[G] baselines of [G, n] group rewards (a group of one: 0)."""
    if baseline not in OPMD_BASELINES:
        raise ValueError(f"baseline must be one of {', '.join(OPMD_BASELINES)}, got {baseline!r}")
    if tau <= 0:
        raise ValueError(f"tau must be positive, got {tau}")
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, samples], got shape {tuple(rewards.shape)}")
    n = rewards.shape[1]
    if n == 1:
        return rewards.new_zeros(rewards.shape[0])
    if baseline == "mean":
        return rewards.mean(dim=1)
    return tau * (torch.logsumexp(rewards / tau, dim=1) - math.log(n))


def opmd_advantages(rewards: Tensor, *, baseline: str = "mean", tau: float = 1.0) -> Tensor:
    """[G, n] sequence advantages: each reward minus its group's baseline."""
    return rewards - opmd_baselines(rewards, baseline=baseline, tau=tau)[:, None]


def opmd_policy_loss(logp: Tensor, advantages: Tensor, loss_mask: Tensor, *, tau: float = 1.0,
                     loss_agg_mode: str = "token-mean", loss_scale_factor: float | None = None
                     ) -> tuple[Tensor, dict[str, Tensor]]:
    """-A * logp over `loss_mask`, averaged as `loss_agg_mode` says (rlkit.trainer.rl_math.aggregation; token-mean
    by default), divided by (1 + tau); returns the loss and detached stats."""
    if tau <= 0:
        raise ValueError(f"tau must be positive, got {tau}")
    for name, t in (("advantages", advantages), ("loss_mask", loss_mask)):
        if t.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(logp.shape)} like logp")
    mask = loss_mask.bool()
    per_token = torch.where(mask, -advantages.detach() * logp, 0.0)
    loss = aggregate(per_token, mask, loss_agg_mode, scale_factor=loss_scale_factor)[0] / (1.0 + tau)
    return loss, {"opmd_loss": loss.detach()}


def sft_nll(logp: Tensor, loss_mask: Tensor) -> Tensor:
    """Token-mean negative log-likelihood over `loss_mask` (the expert rows' response tokens)."""
    mask = loss_mask.bool()
    return -torch.where(mask, logp, 0.0).sum() / mask.sum().clamp(min=1)


def mixed_loss(rl_loss: Tensor, sft_loss: Tensor, mu: float) -> Tensor:
    """(1 - mu) * rl_loss + mu * sft_loss (mu in [0, 1])."""
    if not 0.0 <= mu <= 1.0:
        raise ValueError(f"mu must be in [0, 1], got {mu}")
    return (1.0 - mu) * rl_loss + mu * sft_loss
