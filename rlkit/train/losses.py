"""Policy-gradient losses (PPO/GRPO/GSPO actor, decoupled PPO), KL estimators and entropy, on [B, T] tensors."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

KLEstimator = Literal["k1", "k2", "k3"]


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: KLEstimator = "k1") -> Tensor:
    """Per-token estimate of KL(pi || ref) from log-probs of sampled tokens (Schulman's k1/k2/k3)."""
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r} (expected k1, k2 or k3)")


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)


def _masked_max(x: Tensor, mask: Tensor) -> Tensor:
    if not bool(mask.any()):
        return x.new_zeros(())
    return x[mask].max()


def ppo_actor_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    importance_sampling_level: Literal["token", "sequence"] = "token",
    behav_logp: Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped-surrogate PPO actor loss, token-mean over `loss_mask`; returns the loss and detached stats.

    `importance_sampling_level="sequence"` is GSPO (one ratio per sequence, exp of the masked mean log-ratio).
    `c_clip` is dual clip (bounds the loss of negative-advantage tokens at `c_clip * |A|`). With `behav_logp`
    (decoupled loss), `old_logp` is the proximal policy and each token's loss is weighted by the detached
    behaviour weight exp(old_logp - behav_logp); weights above `behav_imp_weight_cap` become 0 (the
    denominator stays the number of masked tokens).
    """
    shape = logp.shape
    others = {"old_logp": old_logp, "advantages": advantages, "loss_mask": loss_mask}
    if behav_logp is not None:
        others["behav_logp"] = behav_logp
    for name, t in others.items():
        if t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} like logp")
    if c_clip is not None and c_clip <= 1.0:
        raise ValueError(f"c_clip must be > 1, got {c_clip}")
    if importance_sampling_level not in ("token", "sequence"):
        raise ValueError(f"importance_sampling_level must be 'token' or 'sequence', got {importance_sampling_level!r}")
    mask = loss_mask.bool()
    adv = torch.where(mask, advantages, 0.0).detach()
    # Zero the padded positions before exp so garbage there can neither overflow nor leak gradient.
    log_ratio = torch.where(mask, logp - old_logp.detach(), 0.0)
    if importance_sampling_level == "sequence":
        seq_log_ratio = log_ratio.sum(dim=-1, keepdim=True) / mask.sum(dim=-1, keepdim=True).clamp(min=1)
        log_ratio = torch.where(mask, seq_log_ratio.expand_as(log_ratio), 0.0)
    ratio = torch.exp(log_ratio)
    upper = 1.0 + (eps_clip if eps_clip_higher is None else eps_clip_higher)
    clipped_ratio = ratio.clamp(1.0 - eps_clip, upper)
    loss1 = -adv * ratio
    loss2 = -adv * clipped_ratio
    loss_tok = torch.maximum(loss1, loss2)
    clip_mask = (loss2.detach() > loss1.detach()) & mask
    dual_clip_mask = torch.zeros_like(mask)
    if c_clip is not None:
        loss3 = -c_clip * adv
        dual_clip_mask = (adv < 0) & (loss3 < loss_tok.detach()) & mask
        loss_tok = torch.where(adv < 0, torch.minimum(loss_tok, loss3), loss_tok)
    stats: dict[str, Tensor] = {}
    if behav_logp is not None:
        weight = torch.where(mask, torch.exp(old_logp - behav_logp), 0.0).detach()
        kept = mask
        if behav_imp_weight_cap is not None:
            kept = mask & (weight <= behav_imp_weight_cap)
            weight = torch.where(kept, weight, 0.0)
        loss_tok = loss_tok * weight
        stats["behav_weight_mean"] = _masked_mean(weight, kept)
        stats["behav_capped_fraction"] = _masked_mean((mask & ~kept).float(), mask)
    loss = torch.where(mask, loss_tok, 0.0).sum() / mask.sum().clamp(min=1)
    with torch.no_grad():
        stats.update(
            clip_fraction=_masked_mean(clip_mask.float(), mask),
            dual_clip_fraction=_masked_mean(dual_clip_mask.float(), mask),
            importance_weight_mean=_masked_mean(ratio.detach(), mask),
            importance_weight_max=_masked_max(ratio.detach(), mask),
            approx_kl=_masked_mean((old_logp - logp).detach(), mask),
        )
    return loss, {k: v.detach() for k, v in stats.items()}


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax distribution at each position (last dim is the vocabulary); -inf logits are fine."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    safe_logp = logp.clamp(min=torch.finfo(logp.dtype).min)
    return -(logp.exp() * safe_logp).sum(dim=-1)
