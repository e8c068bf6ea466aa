"""Reward shaping and advantage estimation (GRPO-style group normalisation), as pure tensor functions.

Field names follow AReaL's actor config (reward_scaling, reward_bias, reward_clip, overlong_*, mean_level,
std_level, mean_leave1out, mask_no_eos_with_zero).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Level = Literal["group", "batch", "none"]
LEVELS = ("group", "batch", "none")


def shape_rewards(
    rewards: Tensor, *, reward_scaling: float = 1.0, reward_bias: float = 0.0, reward_clip: float = 20.0
) -> Tensor:
    """`(rewards + reward_bias) * reward_scaling`, clipped to `[-reward_clip, reward_clip]`."""
    if reward_clip <= 0:
        raise ValueError(f"reward_clip must be positive, got {reward_clip}")
    return ((rewards + reward_bias) * reward_scaling).clamp(-reward_clip, reward_clip)


def overlong_penalty(
    rewards: Tensor,
    response_lengths: Tensor,
    *,
    max_new_tokens: int,
    overlong_tokens: int,
    overlong_penalty_factor: float,
) -> Tensor:
    """DAPO soft overlong punishment: a penalty growing linearly over the last `overlong_tokens` tokens.

    With `expected = max_new_tokens - overlong_tokens`, a response of length L > expected loses
    `min((L - expected) / overlong_tokens, 1) * overlong_penalty_factor`; shorter responses are unchanged.
    """
    if not 0 < overlong_tokens <= max_new_tokens:
        raise ValueError(f"overlong_tokens must be in (0, max_new_tokens={max_new_tokens}], got {overlong_tokens}")
    expected = max_new_tokens - overlong_tokens
    excess = (response_lengths.to(rewards.dtype) - expected).clamp(min=0.0)
    return rewards - (excess / overlong_tokens).clamp(max=1.0) * overlong_penalty_factor


def _check_level(name: str, level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"{name} must be one of {LEVELS}, got {level!r}")


def group_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    mean_level: Level = "group",
    std_level: Level = "group",
    mean_leave1out: bool = False,
    eps: float = 1e-5,
) -> Tensor:
    """Sequence advantages from a flat tensor of `B * group_size` rewards, ordered group by group.

    The mean is subtracted at `mean_level` (with `mean_leave1out`, each sample's baseline is the mean of the
    other members of its group, or of the batch at batch level); the result is divided by `std + eps` where the
    std is the (unbiased) std of the raw rewards at `std_level`. "none" skips that step.
    """
    _check_level("mean_level", mean_level)
    _check_level("std_level", std_level)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D, got shape {tuple(rewards.shape)}")
    n = rewards.numel()
    if group_size < 1 or n % group_size != 0:
        raise ValueError(f"group_size {group_size} does not divide the number of rewards {n}")
    if mean_leave1out and mean_level != "none" and group_size < 2:
        raise ValueError(f"mean_leave1out needs group_size >= 2, got {group_size}")
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32))

    def view(level: str) -> Tensor:
        return r.view(-1, group_size) if level == "group" else r.view(1, -1)

    adv = r
    if mean_level != "none":
        x = view(mean_level)
        k = x.shape[1]
        if mean_leave1out:
            if k < 2:
                raise ValueError(f"mean_leave1out needs at least 2 samples at {mean_level} level, got {k}")
            baseline = (x.sum(dim=1, keepdim=True) - x) / (k - 1)
        else:
            baseline = x.mean(dim=1, keepdim=True).expand_as(x)
        adv = r - baseline.reshape(-1)
    if std_level != "none":
        x = view(std_level)
        std = x.std(dim=1, keepdim=True, correction=1 if x.shape[1] > 1 else 0)
        adv = adv / (std.expand_as(x).reshape(-1) + eps)
    return adv


def token_advantages(seq_adv: Tensor, loss_mask: Tensor) -> Tensor:
    """Broadcast `[B]` sequence advantages over `[B, T]` response tokens (zero where `loss_mask` is 0)."""
    if seq_adv.dim() != 1 or loss_mask.dim() != 2 or seq_adv.shape[0] != loss_mask.shape[0]:
        raise ValueError(f"expected seq_adv [B] and loss_mask [B, T], got {tuple(seq_adv.shape)}, "
                         f"{tuple(loss_mask.shape)}")
    dtype = seq_adv.dtype if seq_adv.is_floating_point() else torch.float32
    return seq_adv.to(dtype)[:, None] * loss_mask.to(dtype)


def mask_truncated(loss_mask: Tensor, finished: Tensor) -> Tensor:
    """mask_no_eos_with_zero: zero the `[B, T]` mask rows of samples that did not finish (`finished[b]` False)."""
    if finished.shape != loss_mask.shape[:1]:
        raise ValueError(f"finished must have shape [{loss_mask.shape[0]}], got {tuple(finished.shape)}")
    return loss_mask * finished.to(torch.bool)[:, None].to(loss_mask.dtype)
