"""SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347): a sigmoid gate on the importance ratio in place of
PPO's clip, its temperature chosen by the sign of the advantage.

As AReaL's `sapo_loss_fn` (areal/utils/functional/functional.py at 4aef98d8) and verl's `compute_policy_loss_sapo`:
the token's objective is f(r) * A with f(r) = (4 / tau) * sigmoid(tau * (r - 1)), tau = tau_pos where A > 0 and
tau_neg elsewhere (A = 0 included). Its gradient is sech^2(tau * (r - 1) / 2) * r * A * grad log pi: exactly the
policy gradient at r = 1 for any tau, fading smoothly as r leaves 1 (faster for a larger tau) where PPO's clip cuts
to zero; tau -> 0 gives the unclipped surrogate's gradient r * A * grad log pi.
"""

from __future__ import annotations

import torch
from torch import Tensor


def sapo_gate(ratio: Tensor, advantages: Tensor, tau_pos: float, tau_neg: float) -> Tensor:
    """(4 / tau) * sigmoid(tau * (ratio - 1)) per token, tau by the advantage's sign (> 0: tau_pos, else tau_neg)."""
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"SAPO temperatures must be positive, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    tau = torch.where(advantages > 0, ratio.new_tensor(tau_pos), ratio.new_tensor(tau_neg))  # in ratio's dtype
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


def sapo_token_loss(ratio: Tensor, advantages: Tensor, tau_pos: float, tau_neg: float) -> tuple[Tensor, Tensor]:
    """Per-token SAPO loss -gate * A (advantages taken as constants) and the gate, for the caller's reduction."""
    gate = sapo_gate(ratio, advantages, tau_pos, tau_neg)
    return -gate * advantages.detach(), gate
