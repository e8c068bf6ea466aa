"""Reward functions for GRPO: built-ins (math, exact_match), user functions by "module.path:function", and a runner
that calls them in worker processes with a time limit."""

from rlkit.rewards.builtin import BUILTINS, exact_match_reward, extract_answer, math_reward
from rlkit.rewards.resolve import RewardFn, resolve_reward_fn
from rlkit.rewards.runner import RewardOutcome, RewardRunner

__all__ = [
    "BUILTINS",
    "RewardFn",
    "RewardOutcome",
    "RewardRunner",
    "exact_match_reward",
    "extract_answer",
    "math_reward",
    "resolve_reward_fn",
]
