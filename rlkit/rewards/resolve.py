"""`reward.fn` to a callable: a built-in by name, or "module.path:function" imported with importlib.

Called at submit time on the login node (so a bad spec is rejected before anything is queued) and again in the job.
"""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Callable
from typing import Any

from rlkit.errors import ConfigError
from rlkit.rewards.builtin import BUILTINS
from rlkit.rewards.model_reward import REWARD_MODEL, make_reward_model_reward

RewardFn = Callable[[str, str, dict[str, Any]], float]

_FORM = "module.path:function, called as fn(prompt, completion, row) -> float"


def _choices() -> str:
    return ", ".join(sorted([*BUILTINS, REWARD_MODEL]))


def resolve_reward_fn(spec: str, answer_key: str, reward_model_path: str = "") -> RewardFn:
    """The reward function named by `spec`; every mistake raises ConfigError saying what is wrong and how to fix it.
    `reward_model_path`: the model of the built-in `reward_model` (its directory is checked in rlkit.config)."""
    spec = spec.strip()
    if spec == REWARD_MODEL:
        if not reward_model_path:
            raise ConfigError("reward.fn is reward_model but reward.reward_model_path is empty",
                              hint="set reward.reward_model_path to the checkpoints/final directory of an rw trial")
        return make_reward_model_reward(reward_model_path)
    if spec in BUILTINS:
        return BUILTINS[spec](answer_key)
    if ":" not in spec:
        if "." in spec:
            head, _, tail = spec.rpartition(".")
            raise ConfigError(f"reward.fn '{spec}' has no ':' between the module and the function",
                              hint=f"write it as {_FORM}, e.g. '{head}:{tail}'")
        raise ConfigError(f"reward.fn '{spec}' is not a built-in reward (choices: {_choices()})",
                          hint=f"use one of {_choices()}, or a function of your own as {_FORM}")
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr or ":" in attr:
        raise ConfigError(f"reward.fn '{spec}' is not of the form module.path:function", hint=f"write it as {_FORM}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"reward.fn '{spec}': cannot import module '{module_name}': {exc}",
                          hint=f"check the module name, and that '{module_name}' is installed or its directory is on "
                               "PYTHONPATH, both here and in the job") from exc
    except Exception as exc:
        raise ConfigError(f"reward.fn '{spec}': importing module '{module_name}' raised "
                          f"{type(exc).__name__}: {exc}", hint=f"fix the error in module '{module_name}'") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            defined = sorted(n for n, v in vars(module).items()
                             if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module_name)
            raise ConfigError(f"reward.fn '{spec}': module '{module_name}' has no attribute '{attr}'",
                              hint=f"name a function defined there (found: {', '.join(defined) or 'none'})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"reward.fn '{spec}': '{attr}' in module '{module_name}' is a {type(obj).__name__}, "
                          "not callable", hint=f"point reward.fn at a function, as {_FORM}")
    try:
        pickle.dumps(obj)
    except Exception as exc:
        raise ConfigError(f"reward.fn '{spec}': '{attr}' cannot be pickled by reference ({exc}), so it cannot be "
                          "sent to the reward worker processes",
                          hint="define it with `def` at the top level of the module (not a lambda or a nested "
                               "function)") from exc
    fn: RewardFn = obj
    return fn
