"""Sequence-reward shaping as pure tensor functions, in AReaL's order: overlong penalty on the raw reward, then
bias, scaling and clip (areal/trainer/ppo/actor.py `_compute_advantages` at 4aef98d8).

Normalisation is rlkit.trainer.rl_math.normalization; token rewards and GAE are rlkit.trainer.rl_math.gae.
"""

from __future__ import annotations

from torch import Tensor


def shape_rewards(
    rewards: Tensor, *, reward_scaling: float = 1.0, reward_bias: float = 0.0, reward_clip: float = 20.0
) -> Tensor:
    """`(rewards + reward_bias) * reward_scaling`, clipped to `[-reward_clip, reward_clip]` (after the overlong
    penalty, which applies to the raw reward)."""
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
