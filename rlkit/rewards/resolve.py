"""`reward.fn` to a callable: a built-in by name, or "module.path:function" (rlkit.import_path).

Called at submit time on the login node (so a bad spec is rejected before anything is queued) and again in the job.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from rlkit.errors import ConfigError
from rlkit.import_path import import_callable
from rlkit.rewards.builtin import BUILTINS
from rlkit.rewards.model_reward import REWARD_MODEL, make_reward_model_reward

RewardFn = Callable[[str, str, dict[str, Any]], float]

_FORM = "module.path:function, called as fn(prompt, completion, row) -> float"


def _choices() -> str:
    return ", ".join(sorted([*BUILTINS, REWARD_MODEL]))


def resolve_reward_fn(spec: str, answer_key: str, reward_model_path: str = "", *, served: bool = False,
                      prompt_key: str = "prompt") -> RewardFn:
    """The reward function named by `spec`; every mistake raises ConfigError saying what is wrong and how to fix it.
    `reward_model_path`: the model of the built-in `reward_model` (its directory is checked in
    rlkit.checks.reward_model), asked of its servers when `served` (reward.reward_model_engine_num), reading the
    rows' prompt messages from `prompt_key` (a sequence classifier's chat template)."""
    spec = spec.strip()
    if spec == REWARD_MODEL:
        if not reward_model_path:
            raise ConfigError("reward.fn (or a key of reward.fns) is reward_model but reward.reward_model_path is "
                              "empty",
                              hint="set reward.reward_model_path to the checkpoints/final directory of an rw trial, "
                                   "or put an rw stage before this one (stages:)")
        return make_reward_model_reward(reward_model_path, served=served, prompt_key=prompt_key)
    if spec in BUILTINS:
        return BUILTINS[spec](answer_key)
    if ":" not in spec and "." not in spec:
        raise ConfigError(f"reward.fn '{spec}' is not a built-in reward (choices: {_choices()})",
                          hint=f"use one of {_choices()}, or a function of your own as {_FORM}")
    obj = import_callable(spec, setting="reward.fn", form=_FORM)
    try:
        pickle.dumps(obj)
    except Exception as exc:
        attr = spec.partition(":")[2]
        raise ConfigError(f"reward.fn '{spec}': '{attr}' cannot be pickled by reference ({exc}), so it cannot be "
                          "sent to the reward worker processes",
                          hint="define it with `def` at the top level of the module (not a lambda or a nested "
                               "function)") from exc
    fn: RewardFn = obj
    return fn
