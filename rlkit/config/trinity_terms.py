"""Trinity-RFT's KL functions, reward-function names and expert-data ratio as rlkit keys, for `rlkit migrate`
(rlkit.config.trinity): each is moved where rlkit has the same meaning, left out naming the reason where the file
still runs without it, and refused naming why where dropping it would change what the run learns.

Trinity-RFT's names come from its registries: KL_FN (trinity/algorithm/kl_fn/kl_fn.py: none, k1, k2, k3, low_var_kl,
abs, corrected_k3; `kl_coef` defaults to 0.001), REWARD_FUNCTIONS (trinity/common/rewards) and the mix sample
strategy (trinity/algorithm/sample_strategy: `ceil(expert_data_ratio x read batch)` of each batch's experiences are
expert rows, the read batch being `buffer.train_batch_size`, by default `batch_size x repeat_times`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlkit.config.problems import Problems

# Trinity-RFT KL function -> rlkit's estimator (rlkit.trainer.rl_math.kl: k1 = log r, k2 = (log r)^2 / 2,
# k3 = exp(-log r) - 1 + log r, the same formulas); low_var_kl is k3 clamped to [-10, 10], rlkit's default kl_clamp
KL_ESTIMATORS = {"k1": "k1", "k2": "k2", "k3": "k3", "low_var_kl": "k3"}
KL_NOT_BUILT = {
    "abs": "|log p - log p_ref| is not one of rlkit's estimators (k1, k2, k3)",
    "corrected_k3": "k3 weighted by the clamped ratio pi/pi_old: rlkit's k3 has no such weight",
}
TRINITY_KL_COEF = 0.001  # Trinity-RFT's KLFn default kl_coef
# algorithm_type -> its kl_loss_fn where the file names none (or null): config_validator's AlgorithmConfigValidator
# fills it by set_if_none from its base default "k2" updated by the type's default_config() (algorithm.py: ppo, grpo,
# opmd, cispo and gspo name k2; mix names none, so the base k2 stands), and verl_config's synchronize_config turns the
# KL loss on (use_kl_loss) unless it is "none"; these types have use_reference, so the reference model is loaded
KL_LOSS_DEFAULT = {"ppo": "k2", "grpo": "k2", "opmd": "k2", "cispo": "k2", "gspo": "k2", "mix": "k2"}
TRINITY_DEFAULT_TYPE = "ppo"  # AlgorithmConfig.algorithm_type's default
# Trinity-RFT's entropy loss functions (trinity/algorithm/entropy_loss_fn: ENTROPY_LOSS_FN, entropy_coef default 0)
# whose meaning is rlkit's entropy bonus; "basic" is an older release's name of "default"
ENTROPY_FN = "algorithm.entropy_loss_fn"
ENTROPY_FNS = ("default", "basic", "mix")


@dataclass(frozen=True)
class KLTerm:
    """One of Trinity-RFT's two KL terms and the rlkit keys of the same term."""

    fn: str
    estimator: str
    coef: str


PENALTY = KLTerm("algorithm.kl_penalty_fn", "actor.kl_estimator", "actor.kl_ctl")  # the KL reward penalty
# Trinity-RFT's algorithm types (of those rlkit takes) whose AlgorithmType has compute_advantage_in_trainer: its
# trainer builds the KL penalty function for these only (grpo, opmd, mix compute advantages in the explorer)
PENALTY_READ_BY = ("ppo",)
KL_TERMS = (PENALTY, KLTerm("algorithm.kl_loss_fn", "actor.kl_loss_type", "actor.kl_loss_coef"))

# Trinity-RFT reward function -> rlkit's built-in of the same meaning
REWARD_FNS = {
    "accuracy_reward": "math",  # the answer checked with math-verify against the truth column
    "math_boxed_reward": "math",  # the last \boxed{} against the truth (its format score is off unless with_think)
}
REWARD_LEFT_OUT = {
    "math_reward": "its accuracy part is rlkit's math, its <think>/<answer> format score has no rlkit built-in: "
                   "set reward.fn: math, or reward.fns with a format function of your own",
    "format_reward": "a format regex rlkit has no built-in of: write it as a module:function reward",
    "countdown_reward": "the Countdown game's checker: rlkit has no built-in of it",
    "math_dapo_reward": "DAPO's +1/-1 score with its own length penalty: rlkit's math scores 1/0 (its overlong "
                        "penalty: actor.overlong_reward_penalty)",
    "rm_gallery_reward": "RM-Gallery's models are not rlkit's: a reward model trained by job type rw is "
                         "reward.fn: reward_model",
}
REWARD_KEYS = ("buffer.explorer_input.taskset.default_reward_fn_type",  # the taskset's own wins, as in Trinity-RFT
               "buffer.explorer_input.default_reward_fn_type", "buffer.default_reward_fn_type")
RATIO = "algorithm.sample_strategy_args.expert_data_ratio"

Moved = Callable[[str, str, Any, str], None]  # (Trinity-RFT key, rlkit key, value, how): moved, its fate recorded
Left = Callable[[str, str], None]  # (Trinity-RFT key, why): left out, its fate recorded
Put = Callable[[str, Any], None]  # (rlkit key, value): written, no fate of its own (another key's fate says it)
Fate = Callable[[str, Any, str], None]  # (Trinity-RFT key, its value or "(unset)", what became of it)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def kl_terms(leaves: dict[str, Any], moved: Moved, left: Left, put: Put, fate: Fate, problems: Problems,
             source: str) -> set[str]:
    """Move the KL functions and their kl_coef (the penalty's adaptive controller too); refuse the functions rlkit
    lacks and an adaptive KL loss coefficient. Returns the keys judged here. The reward penalty is left out under an
    algorithm whose advantages Trinity-RFT computes outside its trainer (PENALTY_READ_BY: its trainer builds
    kl_penalty_fn only for those that compute them inside), which never reads it: written, rlkit would add a
    penalty the run never had and load a reference model for it. A KL loss the file does not name (or names null)
    is the algorithm type's (KL_LOSS_DEFAULT): left out, the run would lose the KL loss it had."""
    judged: set[str] = set()
    algorithm = leaves.get("algorithm.algorithm_type", TRINITY_DEFAULT_TYPE)
    for term in KL_TERMS:
        args = f"{term.fn}_args."
        arg_keys = [k for k in leaves if k.startswith(args)]
        judged |= {term.fn, *arg_keys}
        if term is PENALTY and algorithm not in PENALTY_READ_BY:
            for key in [k for k in (term.fn, *arg_keys) if k in leaves]:
                left(key, f"Trinity-RFT's {algorithm} computes its advantages outside the trainer, which reads "
                          f"{term.fn} only for {', '.join(PENALTY_READ_BY)}: the run had no KL reward penalty")
            continue
        fn = leaves.get(term.fn)
        named = fn is not None  # null is unset: Trinity-RFT's set_if_none fills it with the default
        if not named and term is not PENALTY and isinstance(algorithm, str) and algorithm in KL_LOSS_DEFAULT:
            fn = KL_LOSS_DEFAULT[algorithm]
        if leaves.get(f"{args}adaptive") is True and term.coef != PENALTY.coef:
            problems.add(f"{args}adaptive ({source}): rlkit's {term.coef} is a fixed coefficient; only the KL "
                         "reward penalty's (kl_penalty_fn) has the adaptive controller",
                         hint="set adaptive: false (or leave it out)")
        if fn is None:  # the penalty's default is none for every algorithm type
            for key in [k for k in (term.fn, *arg_keys) if k in leaves]:
                left(key, f"its function is algorithm_type's default in Trinity-RFT (none): name {term.fn} to "
                          f"have {term.coef} set")
            continue
        if fn == "none":
            left(term.fn, f"none: rlkit's term is off unless {term.coef} > 0")
            for key in arg_keys:
                left(key, f"{term.fn} is none")
            continue
        if not isinstance(fn, str) or fn not in KL_ESTIMATORS:  # a list or mapping is hostile, not a name
            why = KL_NOT_BUILT.get(str(fn), "not one of Trinity-RFT's KL functions rlkit knows")
            problems.add(f"{term.fn} '{fn}' ({source}): {why}",
                         hint=f"use one of {', '.join(KL_ESTIMATORS)} (rlkit's {term.estimator}) or none")
            continue
        coef = leaves.get(f"{args}kl_coef", TRINITY_KL_COEF)
        if not _number(coef) or coef < 0:
            problems.add(f"{args}kl_coef {coef!r} ({source}) is not a number >= 0", hint="e.g. kl_coef: 0.001")
            continue
        clamp = " (k3 clamped to [-10, 10]: rlkit's actor.kl_clamp default)" if fn == "low_var_kl" else ""
        default = "" if f"{args}kl_coef" in leaves else f"; {term.coef} {TRINITY_KL_COEF}, Trinity-RFT's default"
        if coef == 0:  # the term is off: its estimator would be refused as ignored (rlkit.checks.conditional_knobs)
            if named:
                left(term.fn, f"{args}kl_coef is 0: rlkit's term is off")
        elif named:
            moved(term.fn, term.estimator, KL_ESTIMATORS[fn], f" as {KL_ESTIMATORS[fn]}{clamp}{default}")
        else:
            put(term.estimator, KL_ESTIMATORS[fn])
            fate(term.fn, leaves.get(term.fn, "(unset)"),
                 f"moved to {term.estimator} as {KL_ESTIMATORS[fn]}, Trinity-RFT's default for algorithm_type "
                 f"{algorithm} (its default_config; the reference model is actor.path){default}")
        if f"{args}kl_coef" in leaves:
            moved(f"{args}kl_coef", term.coef, coef, "")
        else:
            put(term.coef, coef)  # Trinity-RFT's default coefficient: the file's term is on there
        adaptive = _adaptive(leaves, coef, moved, left, problems, source) if term is PENALTY else set()
        for key in arg_keys:
            if key != f"{args}kl_coef" and key not in adaptive:
                left(key, "rlkit's KL loss coefficient is fixed (no adaptive controller)" if term is not PENALTY
                     else "not one of the KL function's arguments rlkit knows (kl_coef, adaptive, target_kl, horizon)")
    return judged


def _adaptive(leaves: dict[str, Any], coef: float, moved: Moved, left: Left, problems: Problems,
              source: str) -> set[str]:
    """kl_penalty_fn_args' adaptive, target_kl and horizon as actor.kl_ctl_adaptive (rlkit's adaptive controller,
    the same update as Trinity-RFT's KLFn.update_kl_coef). Trinity-RFT has no defaults for the two: its KLFn
    refuses adaptive without them. Returns the keys judged here."""
    args = f"{PENALTY.fn}_args."
    keys = {name: f"{args}{name}" for name in ("adaptive", "target_kl", "horizon")}
    present = {k for k in keys.values() if k in leaves}
    on = leaves.get(keys["adaptive"], False)
    if on is not True:
        why = ("adaptive is off: actor.kl_ctl is fixed" if on in (False, None)
               else f"adaptive {on!r} is not true: Trinity-RFT's KL coefficient is fixed then")
        for key in present:
            left(key, why)
        return present
    if coef == 0:
        for key in present:
            left(key, "kl_coef is 0: the controller multiplies it, so the penalty stays off")
        return present
    target: Any = leaves.get(keys["target_kl"])
    horizon: Any = leaves.get(keys["horizon"])
    bad = False
    if not _number(target) or not math.isfinite(target) or target <= 0:
        problems.add(f"{keys['target_kl']} {target!r} ({source}): adaptive needs a target KL > 0 (Trinity-RFT "
                     "refuses adaptive without one)", hint="e.g. target_kl: 0.1")
        bad = True
    if not _number(horizon) or not math.isfinite(horizon) or horizon < 1 or horizon != int(horizon):
        problems.add(f"{keys['horizon']} {horizon!r} ({source}): adaptive needs a horizon, a whole number >= 1 "
                     "(Trinity-RFT refuses adaptive without one)", hint="e.g. horizon: 10000")
        bad = True
    if not bad:
        block = {"target_kl": target, "horizon": int(horizon)}
        moved(keys["adaptive"], "actor.kl_ctl_adaptive", block, f" (target_kl {target}, horizon {int(horizon)}; "
                                                                 "actor.kl_ctl its starting coefficient)")
        moved(keys["target_kl"], "actor.kl_ctl_adaptive.target_kl", target, "")
        moved(keys["horizon"], "actor.kl_ctl_adaptive.horizon", int(horizon), "")
    return present


def entropy_term(leaves: dict[str, Any], moved: Moved, left: Left, problems: Problems, source: str) -> set[str]:
    """The entropy loss function's entropy_coef as actor.entropy_coeff: Trinity-RFT's default (older: basic) and mix
    functions subtract entropy_coef x the token-mean entropy (mix: of the RL rows, which is all rlkit's RL loss
    sees), none adds nothing. Returns the keys judged here."""
    args = f"{ENTROPY_FN}_args."
    arg_keys = [k for k in leaves if k.startswith(args)]
    coef_key = f"{args}entropy_coef"
    fn = leaves.get(ENTROPY_FN)
    if fn is None:  # absent or null: algorithm_type's default function (set_if_none), which reads entropy_coef
        fn = "default"
    if fn == "none":
        left(ENTROPY_FN, "none: rlkit's entropy bonus is off unless actor.entropy_coeff > 0")
        for key in arg_keys:
            left(key, f"{ENTROPY_FN} is none")
        return {ENTROPY_FN, *arg_keys}
    if not isinstance(fn, str) or fn not in ENTROPY_FNS:
        problems.add(f"{ENTROPY_FN} '{fn}' ({source}) is not one of Trinity-RFT's entropy loss functions rlkit knows",
                     hint=f"use one of {', '.join(ENTROPY_FNS)} (rlkit's actor.entropy_coeff) or none")
        return {ENTROPY_FN, *arg_keys}
    coef = leaves.get(coef_key, 0.0)
    if not _number(coef) or coef < 0:
        problems.add(f"{coef_key} {coef!r} ({source}) is not a number >= 0", hint="e.g. entropy_coef: 0.001")
        return {ENTROPY_FN, *arg_keys}
    over = " (of the RL rows: the expert rows take the SFT loss alone, as in rlkit's mix)" if fn == "mix" else ""
    if ENTROPY_FN in leaves:
        default = "" if coef_key in leaves else ", Trinity-RFT's default entropy_coef 0: off"
        moved(ENTROPY_FN, "actor.entropy_coeff", coef, f" as its entropy_coef {coef}{over}{default}")
    if coef_key in leaves:
        moved(coef_key, "actor.entropy_coeff", coef, over)
    for key in arg_keys:
        if key != coef_key:
            left(key, "rlkit's entropy bonus has one coefficient, actor.entropy_coeff")
    return {ENTROPY_FN, *arg_keys}


def reward_fn(leaves: dict[str, Any], moved: Moved, left: Left) -> set[str]:
    """Move the reward function Trinity-RFT would use (the taskset's, else the explorer input's, else the
    buffer's) to reward.fn where rlkit has a built-in of its meaning; name the others as left out with why."""
    present = [k for k in REWARD_KEYS if k in leaves]
    for rank, key in enumerate(present):
        name = leaves[key]
        if rank > 0:
            left(key, f"{present[0]} wins, as in Trinity-RFT")
        elif isinstance(name, str) and name in REWARD_FNS:
            moved(key, "reward.fn", REWARD_FNS[name], f" as {REWARD_FNS[name]} (the last \\boxed{{}} or number, "
                                                      "checked with math-verify against reward.answer_key)")
        else:
            left(key, REWARD_LEFT_OUT.get(str(name), "not a Trinity-RFT reward rlkit has a built-in of: set "
                                                     "reward.fn (or reward.fns, weighted)"))
    return set(present)


def expert_ratio(leaves: dict[str, Any], moved: Moved, left: Left, problems: Problems, source: str,
                 has_expert_data: bool) -> set[str]:
    """expert_data_ratio as rlkit's expert rows per step: Trinity-RFT's mix takes ceil(ratio x read batch) of
    each batch's experiences from the expert data, rlkit reads expert_dataset.batch_size rows beside the RL batch."""
    if RATIO not in leaves:
        return set()
    ratio = leaves[RATIO]
    if not _number(ratio) or not 0 <= ratio <= 1:
        problems.add(f"{RATIO} {ratio!r} ({source}) is not a fraction in [0, 1]", hint="e.g. expert_data_ratio: 0.5")
        return {RATIO}
    read = leaves.get("buffer.train_batch_size")
    if read is None:
        batch, repeat = leaves.get("buffer.batch_size"), leaves.get("algorithm.repeat_times", 1)
        read = batch * repeat if _number(batch) and _number(repeat) else None
    if not has_expert_data:
        left(RATIO, "there is no expert data (buffer.trainer_input.auxiliary_buffers.sft_dataset)")
    elif ratio == 0:
        left(RATIO, "0: no expert rows; leave expert_dataset out for no mix")
    elif not _number(read):
        left(RATIO, "the batch it is a fraction of (buffer.batch_size x algorithm.repeat_times) is not a number: "
                    "set expert_dataset.batch_size")
    else:
        rows = math.ceil(ratio * read)
        moved(RATIO, "expert_dataset.batch_size", rows,
              f" as {rows} rows (ceil({ratio} x {read} experiences per step); Trinity-RFT takes them out of its "
              "read batch, rlkit reads them beside train_dataset.batch_size prompts)")
    return {RATIO}
