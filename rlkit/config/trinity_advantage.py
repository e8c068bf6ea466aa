"""Trinity-RFT's advantage function (algorithm.advantage_fn and its advantage_fn_args) as rlkit's, for `rlkit migrate`
(rlkit.config.trinity). The key was left out whatever it named ("set by the job type"), and rlkit's grpo job
normalises nothing unless actor.reward_norm says so: a migrated grpo run trained on the raw rewards where Trinity-RFT's
took each group's mean off and divided by its std.

Trinity-RFT's code decides (trinity/algorithm/algorithm.py default_config: advantage_fn grpo for grpo, cispo, gspo and
mix, ppo for ppo, opmd for opmd; config_validator fills it by set_if_none; advantage_fn/grpo_advantage.py
GRPOGroupedAdvantage): (reward - group mean) / (group std + epsilon), torch.std (Bessel-corrected), epsilon 1e-6:
rlkit's reward_norm with mean_level and std_level group, std_unbiased, eps epsilon. A group of one is (reward - 0) / 1
there, which rlkit's group normalisation would make 0 (its mean is the reward itself): with repeat_times 1 the
reward is the advantage, as in rlkit without reward_norm.
"""

from __future__ import annotations

from typing import Any

from rlkit.config.dotted import finite_number
from rlkit.config.problems import Problems
from rlkit.config.trinity_terms import TRINITY_DEFAULT_TYPE, Fate, Left, Moved, Put

FN = "algorithm.advantage_fn"
ARGS = "algorithm.advantage_fn_args."
# algorithm_type -> its default advantage_fn (default_config), for the types rlkit runs
DEFAULT_FN = {"ppo": "ppo", "grpo": "grpo", "cispo": "grpo", "gspo": "grpo", "mix": "grpo", "opmd": "opmd"}
EPSILON = 1e-6  # GRPOGroupedAdvantage's default epsilon
GROUP_NORM = {"mean_level": "group", "std_level": "group", "std_unbiased": True}


def advantage(leaves: dict[str, Any], moved: Moved, left: Left, put: Put, fate: Fate, problems: Problems,
              source: str) -> set[str]:
    """Judge advantage_fn (named or the algorithm type's default), GRPO's arguments and ppo's GAE ones; opmd's (tau,
    opmd_baseline) and std_threshold are judged elsewhere. Returns the keys judged here."""
    kind = leaves.get("algorithm.algorithm_type", TRINITY_DEFAULT_TYPE)
    if not isinstance(kind, str) or kind not in DEFAULT_FN:
        return set()  # refused by algorithm_type's reading
    default = DEFAULT_FN[kind]
    fn = leaves.get(FN)
    fn = default if fn is None else fn  # null is unset: set_if_none fills it
    judged = {FN} & set(leaves)
    if fn != default:
        problems.add(f"{FN} {fn!r} with algorithm_type {kind} ({source}): rlkit's job type computes algorithm_type "
                     f"{kind}'s advantages ({default}) and no other", hint=f"leave advantage_fn out (or {default})")
        return judged | {k for k in leaves if k.startswith(ARGS)}
    if fn != "grpo":
        if FN in leaves:
            left(FN, f"{fn}: algorithm_type {kind}'s advantages, set by the job type")
        return judged | (_gae(leaves, moved, problems, source) if fn == "ppo" else set())
    names = ("epsilon", "std_cal_level", "rank_penalty", "duplicate_experiences")
    args = {name: f"{ARGS}{name}" for name in names if f"{ARGS}{name}" in leaves}
    judged |= set(args.values())
    eps: Any = leaves.get(args.get("epsilon", ""), EPSILON)
    if not finite_number(eps) or eps < 0:
        problems.add(f"{ARGS}epsilon {eps!r} ({source}) is not a number >= 0", hint="e.g. epsilon: 1.0e-6")
        return judged
    level = leaves.get(args.get("std_cal_level", ""), "group")
    if level != "group":
        problems.add(f"{ARGS}std_cal_level {level!r} ({source}): Trinity-RFT's batch divides by the std around the "
                     "batch's mean; rlkit's reward_norm std_level batch takes it around the group means subtracted",
                     hint="use std_cal_level: group (or leave it out)")
    penalty = leaves.get(args.get("rank_penalty", ""))
    if penalty is not None:
        problems.add(f"{ARGS}rank_penalty {penalty!r} ({source}): rlkit has no reward penalty by the rank of the "
                     "old log-probs", hint="leave rank_penalty out (null)")
    if level != "group" or penalty is not None:
        return judged
    if leaves.get("algorithm.repeat_times", 1) == 1:  # AlgorithmConfig's default: groups of one
        why = (f"groups of one (repeat_times 1): Trinity-RFT's GRPO advantage is then reward / (1 + {eps}), the "
               "reward itself, rlkit's without reward_norm")
        for key in [FN, *args.values()]:
            if key in leaves:
                left(key, why)
        if FN not in leaves:
            fate(FN, "(unset)", f"left out ({why})")
        return judged
    norm = {**GROUP_NORM, "eps": eps}
    how = (f" as reward_norm group mean and Bessel-corrected group std + eps {eps}: GRPO's (reward - group mean) / "
           "(group std + epsilon)")
    if FN in leaves:
        moved(FN, "actor.reward_norm", norm, how)
    else:
        put("actor.reward_norm", norm)
        fate(FN, "(unset)", f"moved to actor.reward_norm{how}, Trinity-RFT's default for algorithm_type {kind}")
    if "epsilon" in args:
        moved(args["epsilon"], "actor.reward_norm.eps", eps, "")
    for name in ("std_cal_level", "rank_penalty"):
        if name in args:
            left(args[name], "group: rlkit's std_level group" if name == "std_cal_level" else "null: none")
    if "duplicate_experiences" in args:
        left(args["duplicate_experiences"], "read with std_threshold only")
    return judged


def _gae(leaves: dict[str, Any], moved: Moved, problems: Problems, source: str) -> set[str]:
    """ppo's GAE arguments (PPOAdvantageFn: gamma and lam, both 1.0 by default as rlkit's) as actor.discount and
    actor.gae_lambda: the same recursion over the tokens."""
    judged = set()
    for name, to in (("gamma", "actor.discount"), ("lam", "actor.gae_lambda")):
        key = f"{ARGS}{name}"
        if key in leaves:
            judged.add(key)
            value = leaves[key]
            if not finite_number(value) or not 0 <= value <= 1:
                problems.add(f"{key} {value!r} ({source}) is not a number in [0, 1]", hint=f"e.g. {name}: 1.0")
            else:
                moved(key, to, value, "")
    return judged
