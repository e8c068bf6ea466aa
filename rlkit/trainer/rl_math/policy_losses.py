"""The policy losses other than PPO's clip (actor.policy_loss): CISPO, GMPO and GPG, per token on [B, T] tensors,
for rlkit.trainer.rl_math.losses.ppo_actor_loss to weight and aggregate.

As verl's `compute_policy_loss_cispo`, `compute_policy_loss_geo_mean` and `compute_policy_loss_gpg`
(verl/trainer/ppo/core_algos.py at b178a3cd):

- CISPO (MiniMax-M1, arXiv 2506.13585): -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi. The clipped ratio is a
  constant weight, so every token keeps the gradient w A grad log pi, where PPO's clip zeroes a clipped token's.
- GMPO (arXiv 2507.20673): each token's log-ratio clipped to [-eps_low, eps_high] on the side that limits the update
  (above for A > 0, below for A < 0: PPO's pessimism, in log space), the sequence's ratio the exp of their mean (the
  geometric mean of its token ratios), the loss -A_seq x that ratio, A_seq the sequence's mean advantage.
- GPG (arXiv 2504.02546): -A log pi, the plain policy gradient: no ratio and no clip on any minibatch.
"""

from __future__ import annotations

import torch
from torch import Tensor


def cispo_token_loss(logp: Tensor, ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float
                     ) -> tuple[Tensor, Tensor]:
    """(per-token loss -sg(clip(ratio)) A log pi, whether each token's weight was clipped)."""
    weight = ratio.detach().clamp(1.0 - eps_low, 1.0 + eps_high)
    return -weight * advantages.detach() * logp, weight != ratio.detach()


def gpg_token_loss(logp: Tensor, advantages: Tensor) -> Tensor:
    """Per-token loss -A log pi."""
    return -advantages.detach() * logp


def gmpo_clipped_log_ratio(log_ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """Each token's log-ratio clipped to [-eps_low, eps_high] only where that lowers the objective: min(x, clip(x))
    for A > 0, max(x, clip(x)) for A < 0, 0 for A = 0 (verl's sign(A) x min(sign(A) x, sign(A) clip(x)))."""
    sign = torch.sign(advantages.detach())
    clipped = log_ratio.clamp(-eps_low, eps_high)
    return sign * torch.minimum(sign * log_ratio, sign * clipped)


def gmpo_sequence_loss(log_ratio: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float,
                       weight: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(per-row loss -A_seq x exp(mean clipped log-ratio), 0 for a row without a token in `mask`; per-row ratio;
    tokens whose log-ratio the clip changed) over `mask`'s tokens; `weight` (the decoupled loss's pi_prox / pi_behav
    per token) multiplies each row by its geometric mean over the row, as verl weights geo_mean by its rollout IS
    weights."""
    mask = mask.bool()
    kept = gmpo_clipped_log_ratio(log_ratio, advantages, eps_low, eps_high)
    count = mask.sum(dim=-1)
    per = count.clamp(min=1)
    seq_ratio = torch.exp(torch.where(mask, kept, 0.0).sum(dim=-1) / per)
    seq_adv = torch.where(mask, advantages.detach(), 0.0).sum(dim=-1) / per
    loss = -seq_adv * seq_ratio
    if weight is not None:
        log_w = torch.log(weight.detach().clamp(min=1e-10))
        loss = loss * torch.exp(torch.where(mask, log_w, 0.0).sum(dim=-1) / per)
    clipped = (kept.detach() != log_ratio.detach()) & (advantages != 0) & mask
    return torch.where(count > 0, loss, 0.0), seq_ratio, clipped
