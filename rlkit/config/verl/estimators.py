"""verl's algorithm.adv_estimator as rlkit settings, for `rlkit migrate`: rlkit has no estimator switch, so each
outcome-reward estimator becomes the grpo job type with the reward_norm / adv_norm / passk_advantage / gpg_scale that
give its advantages (each checked in the unit suite against the estimator computed from its definition), GAE the ppo
job type; the header line of algorithm.adv_estimator says what it became. The estimators rlkit cannot reproduce are
refused with why (docs/algorithms.md, "verl's advantage estimators as settings").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlkit.config.verl.mapping import RunMapping, put

KEY, STD_KEY = "algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo"
KL_IN_REWARD, KL_COEF = "algorithm.use_kl_in_reward", "algorithm.kl_ctrl.kl_coef"
VERL_KL_COEF = 0.001  # verl's default kl_loss_coef and kl_ctrl.kl_coef
GRPO_EPS = 1e-6  # verl's epsilon in its group estimators
WHITENED = {"mean_level": "batch", "std_level": "batch"}  # verl's masked_whiten over the batch's tokens
LEAVE_ONE_OUT = {"mean_level": "group", "mean_leave1out": True, "std_level": None}
GROUP_MEAN = {"mean_level": "group", "std_level": None}
# Each estimator rlkit takes: the actor settings it becomes (reward_norm None: written as null) and what the header
# says it is. grpo and grpo_passk divide by the group's std unless norm_adv_by_std_in_grpo is false (_grpo_norm).
SETTINGS: dict[str, tuple[dict[str, Any], str]] = {
    "grpo": ({}, "actor.reward_norm at group level (verl's GRPO advantage)"),
    "grpo_vectorized": ({}, "actor.reward_norm at group level: verl's GRPO advantage, vectorized (its group "
                            "variance floored at 1e-6: a group whose rewards spread by under ~1e-3 gets smaller "
                            "advantages in verl, 0/1 rewards the same)"),
    "rloo": ({"reward_norm": LEAVE_ONE_OUT}, "actor.reward_norm the leave-one-out group mean (verl's RLOO)"),
    "rloo_vectorized": ({"reward_norm": LEAVE_ONE_OUT}, "actor.reward_norm the leave-one-out group mean (verl's "
                                                        "RLOO, vectorized: the same for groups of 2 or more)"),
    "grpo_passk": ({"passk_advantage": True}, "actor.reward_norm at group level, then actor.passk_advantage: each "
                                              "group's best completion keeps its margin over the second best "
                                              "(verl's pass@k advantage)"),
    "opo": ({"reward_norm": None, "adv_norm": GROUP_MEAN}, "no actor.reward_norm, actor.adv_norm the group's "
                                                           "token-weighted mean: the length-weighted mean reward as "
                                                           "the baseline (verl's OPO)"),
    "gpg": ({"reward_norm": GROUP_MEAN, "gpg_scale": True}, "actor.reward_norm the group mean, then actor.gpg_scale: "
                                                            "x the batch's samples over its nonzero rewards (verl's "
                                                            "GPG advantage)"),
    "reinforce_plus_plus": ({"reward_norm": None, "adv_norm": WHITENED}, "no group baseline (actor.reward_norm "
                            "null), the returns whitened over the batch's tokens (actor.adv_norm): verl's REINFORCE++"),
    "reinforce_plus_plus_baseline": ({"reward_norm": GROUP_MEAN, "adv_norm": WHITENED}, "the group mean subtracted "
                                     "(actor.reward_norm), then whitened over the batch's tokens (actor.adv_norm): "
                                     "verl's REINFORCE++-baseline"),
}
# Estimators that work on each sequence's summed token rewards, giving every token one value: with the KL reward
# penalty (use_kl_in_reward) verl's sum holds the penalties, so rlkit sums its penalty into the sequence's reward
# before the advantage too (actor.kl_penalty_level: sequence), not per token after it (its default, which is verl's
# for GAE and REINFORCE++, whose returns run over the token rewards)
SUMMED = ("grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "reinforce_plus_plus_baseline", "grpo_passk", "opo",
          "gpg")
NOT_BUILT = {
    "remax": "its baseline is the reward of a greedy completion of each prompt, an extra rollout rlkit's servers do "
             "not make",
    "optimal_token_baseline": "its per-token baseline weighs each token by the policy's sum of squared "
                              "probabilities over the vocabulary, which rlkit's trainer does not compute",
    "tir_optimal_token_baseline": "its per-token baseline weighs each token by the policy's sum of squared "
                                  "probabilities over the vocabulary, which rlkit's trainer does not compute",
}


def algorithm(m: RunMapping, estimators: Mapping[str, str]) -> None:
    """algorithm.adv_estimator as the job type and its advantage settings."""
    estimator = m.leaves.get(KEY, "gae")
    default = "" if KEY in m.leaves else " (verl's default)"
    job = estimators.get(estimator) if isinstance(estimator, str) else None
    if job is not None and estimator == "grpo_vectorized" and m.leaves.get(STD_KEY, True) is False:
        m.refuse(STD_KEY, "verl's grpo_vectorized does not read it: it divides by the group's std all the same",
                 "remove it to migrate what verl ran, or use algorithm.adv_estimator=grpo for Dr. GRPO (no division "
                 "by the std)")
    elif job is not None and estimator in SETTINGS:
        settings, said = SETTINGS[estimator]
        if estimator in ("grpo", "grpo_vectorized", "grpo_passk"):
            _grpo_norm(m, estimator)
        for name, value in settings.items():
            put(m.out, f"actor.{name}", dict(value) if isinstance(value, dict) else value)
        if estimator in SUMMED and _kl_in_reward(m):
            put(m.out, "actor.kl_penalty_level", "sequence")
            said += ("; the KL reward penalty summed into each sequence's reward first (actor.kl_penalty_level: "
                     "sequence), as verl's sum of the token rewards holds it")
        m.moved(KEY, "type", job, f" as {job}, {said}")
    elif job is not None and estimator == "gae":
        put(m.out, "actor.adv_norm", dict(WHITENED))
        m.critic = True  # GAE runs over a critic's values
        m.moved(KEY, "type", job, f" as {job}{default}, a critic; actor.adv_norm whitens the advantages over the "
                                  "batch, as verl's GAE does")
    else:
        why = (f"not built in rlkit: {NOT_BUILT[estimator]}" if estimator in NOT_BUILT
               else "not one of verl's estimators rlkit knows")
        m.refuse(KEY, why, f"use {either(list(estimators), 'or')} (rlkit's "
                           f"{either(sorted(set(estimators.values())), 'and')} job types)")
    if STD_KEY in m.leaves and STD_KEY not in m.done:
        m.left(STD_KEY, "read by verl's grpo and grpo_passk only")
    # verl's GAE reads gamma and lam, its REINFORCE++ gamma alone, the other estimators neither (their advantage is
    # the same on every token); rlkit's returns read actor.discount and gae_lambda under every job type, so they
    # keep their defaults (1) where verl would not have used them
    for name, to, used_by in (("algorithm.gamma", "actor.discount", ("gae", "reinforce_plus_plus")),
                              ("algorithm.lam", "actor.gae_lambda", ("gae",))):
        if name in m.leaves and estimator not in used_by and job is not None:
            m.left(name, f"verl's {estimator} advantage does not read it (rlkit's {to} stays 1)")


def _kl_in_reward(m: RunMapping) -> bool:
    """Whether verl's KL reward penalty is on: use_kl_in_reward with a coefficient above 0 (a coefficient that is no
    number is refused with the KL keys)."""
    coef = m.leaves.get(KL_COEF, VERL_KL_COEF)
    return m.leaves.get(KL_IN_REWARD, False) is True and isinstance(coef, int | float) and coef > 0


def _grpo_norm(m: RunMapping, estimator: str) -> None:
    """reward_norm at group level with verl's epsilon, divided by the std unless norm_adv_by_std_in_grpo is false
    (grpo_vectorized's false is refused above: it does not read it)."""
    by_std = m.leaves.get(STD_KEY, True)
    norm = {"mean_level": "group", "std_level": "group" if by_std else None, "eps": GRPO_EPS}
    put(m.out, "actor.reward_norm", norm)
    if STD_KEY in m.leaves:
        m.moved(STD_KEY, "actor.reward_norm.std_level", norm["std_level"],
                " as group" if by_std else " as null (Dr. GRPO: no division by the std)" if estimator == "grpo"
                else " as null (the margin not divided by the std)")


def either(names: list[str], word: str) -> str:
    """'a, b or c' (`word` 'or'), 'a and b'."""
    return f"{', '.join(names[:-1])} {word} {names[-1]}" if len(names) > 1 else "".join(names)
