"""Decoupled PPO's behaviour importance weight pi_prox / pi_behav, bounded by AReaL's rejection_sampling block.

One implementation for both AReaL forms: the older `behav_imp_weight_cap` (AReaL 61d1bbb3: drop tokens whose
weight exceeds the cap) is `RejectionSamplingConfig(level="token", action="mask", metric="ratio", upper=cap)` of
the current form (areal/utils/functional/functional.py `apply_rejection_sampling` at 4aef98d8). `action="clamp"`
is truncated importance sampling (verl's TIS): an out-of-bounds weight becomes the bound instead of 0.

`mask` is the packed loss mask, which holds sampled tokens only: a multi-turn episode's inserted tokens carry a
behaviour log-prob of 0.0 that is no log-prob at all, and no weight, metric or sequence aggregate ever reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlkit.config.schema.actor import RejectionSamplingConfig
from rlkit.trainer.rl_math.kl import kl_estimate


@dataclass
class BehaviourWeights:
    weight: Tensor  # [B, T] detached, 0 outside `mask`
    mask: Tensor  # [B, T] bool: the loss mask after rejection (unchanged for clamp)
    filtered_fraction: Tensor  # scalar: masked or clamped share of the original tokens


def rejection_config(cap: float | None, block: RejectionSamplingConfig | None) -> RejectionSamplingConfig | None:
    """The one block both config forms map onto (the validation refuses setting both)."""
    if block is not None:
        return block
    if cap is not None:
        return RejectionSamplingConfig(level="token", action="mask", metric="ratio", upper=cap)
    return None


def _in_bounds(metric: Tensor, rs: RejectionSamplingConfig) -> Tensor:
    ok = metric <= rs.upper
    return ok & (metric >= rs.lower) if rs.lower is not None else ok


def behaviour_weights(prox_logp: Tensor, behav_logp: Tensor, mask: Tensor, rs: RejectionSamplingConfig | None, *,
                      log_ratio_clamp: float | None = 20.0) -> BehaviourWeights:
    """The weight exp(prox - behav) per token (or the sequence's geometric mean for a sequence-level ratio),
    with out-of-bounds tokens/sequences masked or their weights clamped. Without `rs` the weight is unbounded."""
    mask = mask.bool()
    log_ratio = prox_logp.detach().float() - behav_logp.detach().float()
    log_ratio = torch.where(mask & torch.isfinite(log_ratio), log_ratio, 0.0)
    if log_ratio_clamp is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
    weight = torch.exp(log_ratio)
    total = mask.sum().clamp(min=1)
    if rs is None:
        return BehaviourWeights(torch.where(mask, weight, 0.0), mask, torch.zeros(()))
    if rs.metric == "ratio":
        metric = weight
    else:
        metric, _ = kl_estimate(prox_logp.detach(), behav_logp.detach(), rs.metric.removeprefix("kl_"), clamp=None)
        metric = torch.where(mask, metric, 0.0)
    lower = rs.lower if rs.lower is not None else 0.0
    if rs.level == "token":
        if rs.action == "mask":
            keep = mask & _in_bounds(metric, rs)
            return BehaviourWeights(torch.where(keep, weight, 0.0), keep, (mask & ~keep).sum() / total)
        clamped = weight.clamp(lower, rs.upper)
        changed = mask & (clamped != weight)
        return BehaviourWeights(torch.where(mask, clamped, 0.0), mask, changed.sum() / total)
    # Sequence level: the ratio metric aggregates in log space (geometric), KL metrics arithmetically.
    count = mask.sum(dim=-1, keepdim=True).clamp(min=1)
    values = log_ratio if rs.metric == "ratio" else metric
    if rs.metric == "ratio":
        weight = torch.exp(log_ratio.sum(dim=-1, keepdim=True) / count).expand_as(log_ratio)
    if rs.agg == "sum":
        agg = torch.where(mask, values, 0.0).sum(dim=-1, keepdim=True)
    elif rs.agg == "mean":
        agg = torch.where(mask, values, 0.0).sum(dim=-1, keepdim=True) / count
    else:
        agg = values.masked_fill(~mask, float("-inf")).amax(dim=-1, keepdim=True)
        agg = torch.where(mask.any(dim=-1, keepdim=True), agg, 0.0)
    seq_metric = torch.exp(agg) if rs.metric == "ratio" else agg
    seq_ok = _in_bounds(seq_metric, rs).expand_as(mask)
    if rs.action == "mask":
        keep = mask & seq_ok
        return BehaviourWeights(torch.where(keep, weight, 0.0), keep, (mask & ~keep).sum() / total)
    bounded = torch.where(seq_ok, weight, weight.clamp(lower, rs.upper))
    changed = mask & (bounded != weight)
    return BehaviourWeights(torch.where(mask, bounded, 0.0), mask, changed.sum() / total)
