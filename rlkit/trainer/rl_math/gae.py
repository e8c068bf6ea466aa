"""Token rewards and generalised advantage estimation over completion tokens, as AReaL's PPO actor does them.

Tensors are [B, T] over completion tokens (position j is the j-th completion token; `mask` marks the ones that take
part: real, sampled tokens).

Multi-turn episodes: GAE runs over the sampled tokens only, as if the inserted ones (tool results, user turns) were not
there. That is the MDP of an agent: an action is a sampled token, and the environment's reply is part of the next
state, whose value the critic gives at the next sampled token (its context holds the inserted tokens). So an inserted
token neither earns a reward nor discounts, and its value is never used; `discount` applies once per sampled token.
Reference: AReaL areal/trainer/ppo/actor.py `_compute_advantages` at 4aef98d8.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_rewards(seq_rewards: Tensor, mask: Tensor, kl: Tensor | None = None, *, kl_ctl: float = 0.0) -> Tensor:
    """-kl_ctl * kl on every masked completion token, plus the sequence reward on the last masked one (AReaL's
    tot_rewards; an episode's last sampled token, whatever rlkit inserted after it).

    The KL penalty is a reward: it carries no gradient (`kl` is detached).
    """
    if mask.dim() != 2 or seq_rewards.shape != mask.shape[:1]:
        raise ValueError(f"expected seq_rewards [B] and mask [B, T], got {tuple(seq_rewards.shape)}, "
                         f"{tuple(mask.shape)}")
    m = mask.to(torch.float64)
    rewards = torch.zeros_like(m)
    if kl is not None and kl_ctl != 0.0:
        rewards = -kl_ctl * kl.detach().to(torch.float64) * m
    # the last masked position, not the count - 1: an episode's mask has holes where rlkit inserted tokens
    if mask.shape[1] == 0:
        return rewards
    last = torch.where(mask.bool(), torch.arange(mask.shape[1], device=mask.device), -1).amax(dim=1)
    rows = torch.nonzero(last >= 0).flatten()
    rewards[rows, last[rows]] += seq_rewards.to(torch.float64)[rows]
    return rewards


def gae_advantages(rewards: Tensor, mask: Tensor, *, discount: float = 1.0, gae_lambda: float = 1.0,
                   values: Tensor | None = None, last_values: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(advantages, returns) by GAE; masked-out positions are skipped (they neither add nor discount).

    delta_t = r_t + discount * V_next - V_t and A_t = delta_t + discount * gae_lambda * A_next, where "next" is the
    next masked token. Without `values` (GRPO: no critic) V is 0 and, with discount = gae_lambda = 1, A_t is the sum
    of the rewards from t on. `last_values` [B] bootstraps sequences cut before their end (a critic's value of the
    state after the last token; 0 when omitted).
    """
    if rewards.shape != mask.shape or rewards.dim() != 2:
        raise ValueError(f"rewards {tuple(rewards.shape)} and mask {tuple(mask.shape)} must be the same [B, T]")
    r = rewards.to(torch.float64)
    m = mask.to(torch.float64)
    v = torch.zeros_like(r) if values is None else values.to(torch.float64)
    if v.shape != r.shape:
        raise ValueError(f"values has shape {tuple(v.shape)}, expected {tuple(r.shape)}")
    b, t_len = r.shape
    next_value = torch.zeros(b, dtype=torch.float64) if last_values is None else last_values.to(torch.float64)
    last_gae = torch.zeros(b, dtype=torch.float64)
    adv = torch.zeros_like(r)
    for t in reversed(range(t_len)):
        delta = r[:, t] + discount * next_value - v[:, t]
        new_gae = delta + discount * gae_lambda * last_gae
        keep = m[:, t]
        next_value = next_value * (1 - keep) + v[:, t] * keep
        last_gae = last_gae * (1 - keep) + new_gae * keep
        adv[:, t] = last_gae
    adv = adv * m
    return adv, (adv + v) * m
