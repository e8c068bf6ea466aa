"""Group estimators that reward_norm's mean/std cannot express, applied to its output (pure): the pass@k advantage
(actor.passk_advantage) and GPG's batch correction (actor.gpg_scale). Both are verl's estimators of the same names
(grpo_passk, gpg), built from their papers' definitions: arXiv 2503.19595 (pass@k) and 2504.02546 (GPG).
"""

from __future__ import annotations

import torch
from torch import Tensor


def best_only(values: Tensor, group_size: int) -> Tensor:
    """Pass@k: in each group (`group_size` consecutive values) the highest value keeps its margin over the group's
    second highest, every other value becomes 0; a tie at the top leaves the whole group 0.

    Applied after reward_norm, whose group statistics are one affine map per group, the margin is the raw margin
    over the group's std (+ eps) with std_level group, the raw margin with std_level null: verl's grpo_passk either
    way. A group of one has no second best: refused (verl raises too)."""
    if group_size < 2 or values.shape[0] % group_size:
        raise ValueError(f"pass@k needs groups of 2 or more that divide the {values.shape[0]} values, got "
                         f"{group_size}")
    groups = values.reshape(-1, group_size)
    top = torch.topk(groups, 2, dim=1)
    out = torch.zeros_like(groups)
    margin = top.values[:, 0] - top.values[:, 1]
    out.scatter_(1, top.indices[:, :1], margin[:, None])
    return out.reshape(values.shape)


def nonzero_scale(rewards: Tensor) -> float:
    """GPG's correction factor, as verl computes it: the batch's samples over those with a nonzero reward (at least
    1), which scales the advantages up when few samples are rewarded."""
    return rewards.numel() / max(1, int(torch.count_nonzero(rewards)))
