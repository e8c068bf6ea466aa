"""verl's reward-manager keys for `rlkit migrate`: DAPO's overlong reward penalty as rlkit's, a reward manager class of
the user's own refused, verl's code sandbox left out saying why (rlkit.config.verl.rules calls these before
learning.reward_model, which would otherwise leave every reward_model.* key out with the reward model).

DAPO's penalty: with reward_model.reward_manager dapo and reward_model.reward_kwargs.overlong_buffer_cfg.enable, verl
adds to the score of a response of L tokens (verl/experimental/reward_loop/reward_manager/dapo.py
DAPORewardManager.run_single; verl/workers/reward_manager/dapo.py DAPORewardManager.__call__ the same)

    min(-(L - (max_resp_len - len)) / len * penalty_factor, 0)

(max_resp_len: reward_model.reward_kwargs.max_resp_len; L, the response's valid tokens, at most
data.max_response_length, M). rlkit subtracts (rlkit.trainer.rl_math.advantages.overlong_penalty, on the raw reward
as verl does, before the group's normalisation)

    min(max(L - (M - overlong_tokens), 0) / overlong_tokens, 1) * overlong_penalty_factor.

Both are 0 up to a start length and then fall linearly; with s = max_resp_len - len, verl's start, overlong_tokens
M - s and overlong_penalty_factor penalty_factor * (M - s) / len give the same start and slope, and rlkit's clip at 1
binds only at L = M, the longest response, where both are penalty_factor * (M - s) / len. verl's DAPO scripts write
max_resp_len = M: the same len and penalty_factor."""

from __future__ import annotations

from typing import Any

from rlkit.config.dotted import finite_number
from rlkit.config.verl.mapping import RunMapping, is_count, put

KWARGS = "reward_model.reward_kwargs."
CFG = f"{KWARGS}overlong_buffer_cfg."
ENABLE, LENGTH, FACTOR, LOG, MAX_RESP = (f"{CFG}enable", f"{CFG}len", f"{CFG}penalty_factor", f"{CFG}log",
                                         f"{KWARGS}max_resp_len")
MANAGER = "reward_model.reward_manager"
OURS = "actor.overlong_reward_penalty"


def rlkit_overlong(buffer: int, factor: float, max_resp_len: int, longest: int) -> tuple[int, float] | None:
    """rlkit's (overlong_tokens, overlong_penalty_factor) giving verl's DAPO penalty for every response of at most
    `longest` tokens (data.max_response_length); None when no such response reaches verl's penalty."""
    start = max_resp_len - buffer
    if start >= longest:
        return None
    tokens = longest - start
    return tokens, factor * tokens / buffer


def reward_managers(m: RunMapping) -> None:
    """reward_model.reward_kwargs (read by verl's dapo reward manager), a reward manager class of the user's own
    (reward_model.reward_loop_source, or the top-level reward_manager.source, importlib), and verl's code sandbox."""
    _overlong(m)
    # (its switch, its other keys, where verl reads it): the reward loop's, and load_reward_manager's
    for source, others, where in (
            ("reward_model.reward_loop_source", ("reward_model.reward_loop_module_path",
                                                 "reward_model.reward_loop_class_name"),
             "verl/experimental/reward_loop/reward_loop.py RewardLoopWorker._init_reward_fn"),
            ("reward_manager.source", ("reward_manager.module.path", "reward_manager.module.name",
                                       "reward_manager.module._target_", "reward_manager._target_"),
             "verl/trainer/ppo/reward.py load_reward_manager")):
        if m.leaves.get(source) == "importlib":
            m.refuse(source, f"a reward manager class of your own scores the run ({where})",
                     "write fn(prompt, completion, row) scoring as it does and pass reward.fn=/path/file.py:fn",
                     unless="reward.fn")
        elif source in m.leaves:
            m.left(source, "verl's registered reward managers: not importlib")
        for key in others:
            if key in m.leaves:
                m.left(key, f"with {source}")
    if "reward_manager.name" in m.leaves:  # verl's newer name for reward_model.reward_manager
        m.left("reward_manager.name", "the reward manager: rlkit calls reward.fn per completion (DAPO's overlong "
                                      "penalty: reward_model.reward_kwargs)")
    for key in [k for k in m.leaves if k.startswith("reward_model.sandbox_fusion.")]:
        m.left(key, "where verl's default scorer runs the code of code data_sources; rlkit scores with reward.fn "
                    "(code rows need one of your own: the header's note on the reward)")


def _overlong(m: RunMapping) -> None:
    leaves = m.leaves
    keys = [k for k in leaves if k.startswith(KWARGS)]
    if not keys:
        return
    manager = leaves.get(MANAGER, leaves.get("reward_manager.name", "naive"))
    if not isinstance(manager, str) or "$" in manager:
        m.refuse(MANAGER, "not a name rlkit can read (a shell variable?): whether the reward_kwargs' overlong "
                          "penalty applies depends on it being dapo", "write the manager's name, e.g. "
                                                                      f"{MANAGER}=dapo")
        m.done.update(keys)
        return
    if manager != "dapo":
        for key in keys:
            m.left(key, f"read by verl's dapo reward manager only; reward_model.reward_manager is {manager}")
        return
    others = [k for k in keys if k not in (ENABLE, LENGTH, FACTOR, LOG, MAX_RESP)]
    for key in others:
        m.left(key, "not read by verl's dapo reward manager")
    if LOG in leaves:
        m.left(LOG, "metrics only")
    enable = leaves.get(ENABLE, False)
    rest = [k for k in (LENGTH, FACTOR, MAX_RESP) if k in leaves]
    if enable in (False, None):
        if ENABLE in leaves:
            m.left(ENABLE, "false: no overlong penalty")
        for key in rest:
            m.left(key, "overlong_buffer_cfg.enable is false")
        return
    if OURS in m.overridden:
        for key in (ENABLE, *rest):
            m.left(key, f"DAPO's overlong penalty; your {OURS} override is used")
        return
    if enable is not True:
        m.refuse(ENABLE, "not true or false", f"write {ENABLE}=True or False (rlkit does not expand the script's "
                                              "shell variables)")
        m.done.update(rest)
        return
    _penalty(m, rest)


def _penalty(m: RunMapping, rest: list[str]) -> None:
    leaves = m.leaves
    buffer: Any = leaves.get(LENGTH)
    factor: Any = leaves.get(FACTOR)
    resp: Any = leaves.get(MAX_RESP)
    longest: Any = leaves.get("data.max_response_length", 512)  # verl's default (legacy_data.yaml)
    ok = True
    for key, good, what, example in ((LENGTH, is_count(buffer), "a whole number > 0", "4096"),
                                     (FACTOR, finite_number(factor) and factor >= 0, "a number >= 0", "1.0"),
                                     (MAX_RESP, is_count(resp), "a whole number > 0, which verl's dapo manager needs "
                                                                "with the penalty", "data.max_response_length's")):
        if not good:
            ok = False
            m.refuse(key, f"not {what}", f"set {key} (e.g. {example})")
    if ok and not is_count(longest):
        ok = False
        m.refuse(ENABLE, f"data.max_response_length {longest!r} is not a whole number here: the penalty ends there",
                 "write data.max_response_length's value")
    if ok and resp < buffer:
        ok = False
        m.refuse(LENGTH, f"longer than {MAX_RESP} {resp}: verl's dapo manager refuses it", f"make it at most {resp}")
    if not ok:
        m.done.update([ENABLE, *rest])
        return
    converted = rlkit_overlong(buffer, factor, resp, longest)
    if converted is None:
        for key in (ENABLE, *rest):
            m.left(key, f"no response reaches DAPO's penalty: it starts at {MAX_RESP} - len = {resp - buffer} tokens, "
                        f"responses end at data.max_response_length {longest}")
        return
    tokens, scale = converted
    put(m.out, "actor.overlong_tokens", tokens)
    put(m.out, "actor.overlong_penalty_factor", scale)
    m.moved(ENABLE, OURS, True, " (DAPO's penalty, the same for every length: rlkit.config.verl.overlong)")
    same = tokens == buffer
    m.fate(LENGTH, f"moved to actor.overlong_tokens {tokens}" + (
        "" if same else f" (converted: the penalty starts at {MAX_RESP} - len = {longest - tokens} tokens, "
                        f"{tokens} before data.max_response_length {longest})"))
    m.fate(FACTOR, f"moved to actor.overlong_penalty_factor {scale:g}" + (
        "" if same else f" (converted: penalty_factor x {tokens}/{buffer}, the same slope per token)"))
    if MAX_RESP in leaves:
        m.left(MAX_RESP, "data.max_response_length, as rlkit's penalty reads it" if same else
               "converted into actor.overlong_tokens and overlong_penalty_factor")
