"""From scored rollout groups to training samples with advantages (pure; runs on trainer rank 0)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlkit.config.schema_actor import ActorConfig
from rlkit.train.advantages import group_advantages, overlong_penalty, shape_rewards
from rlkit.types import Sample


@dataclass
class PreparedBatch:
    samples: list[Sample]
    dropped_groups: int  # dynamic sampling: groups with identical rewards carry no signal
    raw_rewards: list[float]


def prepare_batch(groups: Sequence[Sequence[Sample]], actor: ActorConfig, *, max_new_tokens: int) -> PreparedBatch:
    """Shape rewards, apply the overlong penalty, drop flat groups (dynamic_sampling), normalise advantages."""
    raw = [s.reward for g in groups for s in g]
    kept = [list(g) for g in groups]
    dropped = 0
    if actor.dynamic_sampling:
        kept = [g for g in kept if len({s.reward for s in g}) > 1]
        dropped = len(groups) - len(kept)
    samples = [s for g in kept for s in g]
    if not samples:
        return PreparedBatch([], dropped, raw)
    sizes = {len(g) for g in kept}
    if sizes != {actor.group_size}:
        raise ValueError(f"groups of sizes {sorted(sizes)}, expected actor.group_size={actor.group_size}")
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    rewards = shape_rewards(rewards, reward_scaling=actor.reward_scaling, reward_bias=actor.reward_bias,
                            reward_clip=actor.reward_clip)
    if actor.overlong_reward_penalty and actor.overlong_tokens and actor.overlong_penalty_factor is not None:
        lengths = torch.tensor([len(s.completion_ids) for s in samples])
        rewards = overlong_penalty(rewards, lengths, max_new_tokens=max_new_tokens,
                                   overlong_tokens=actor.overlong_tokens,
                                   overlong_penalty_factor=actor.overlong_penalty_factor)
    norm = actor.adv_norm
    adv = group_advantages(rewards, actor.group_size, mean_level=norm.mean_level,  # type: ignore[arg-type]
                           std_level=norm.std_level, mean_leave1out=norm.mean_leave1out,  # type: ignore[arg-type]
                           eps=norm.eps)
    for s, a, r in zip(samples, adv.tolist(), rewards.tolist(), strict=True):
        s.advantage = float(a)
        s.info["shaped_reward"] = float(r)
    return PreparedBatch(samples, dropped, raw)
