"""Submit-time checks of the reward, advantage, KL and loss knobs (issue 17): refuse what has no meaning.

AReaL's own checks (NormConfig and RejectionSamplingConfig `__post_init__` at 4aef98d8) are here, plus the
combinations AReaL accepts but ignores or turns into a division by zero. Every problem names its field and fix.
"""

from __future__ import annotations

import math

from rlkit.config.problems import Problems
from rlkit.config.schema.actor import (
    KL_CONTROL_ERROR_CLIP,
    PROX_LOGP_METHODS,
    ActorConfig,
    NormConfig,
    RejectionSamplingConfig,
)

NORM_LEVELS = ("batch", "group", None, "none")
KL_ESTIMATORS = ("k1", "k2", "k3")
KL_PENALTY_LEVELS = ("token", "sequence")  # actor.kl_penalty_level (rlkit.trainer.rl_math.advantage_batch)
RS_CHOICES = {
    "level": ("token", "sequence"),
    "action": ("mask", "clamp"),
    "metric": ("ratio", "kl_k1", "kl_k2", "kl_k3"),
    "agg": ("sum", "mean", "max"),
}


def validate_algorithm(actor: ActorConfig, problems: Problems) -> None:
    """Add every problem of the reward/advantage/KL/loss fields of `actor` to `problems`."""
    for name in ("reward_norm", "adv_norm"):
        norm = getattr(actor, name)
        if norm is not None:
            _validate_norm(f"actor.{name}", norm, actor.group_size, problems)
    if actor.passk_advantage and actor.group_size < 2:
        problems.add(f"actor.passk_advantage with groups of {actor.group_size} sample: the pass@k advantage is the "
                     "best completion's margin over its group's second best, and a group of one has none",
                     hint="set gconfig.n_samples and actor.group_size to 2 or more (e.g. 8), or remove "
                          "actor.passk_advantage")
    for name in ("kl_estimator", "kl_loss_type"):
        value = getattr(actor, name)
        if value not in KL_ESTIMATORS:
            problems.add(f"actor.{name} '{value}' is not one of: k1, k2, k3", hint=f"e.g. actor.{name}=k3")
    if actor.kl_penalty_level not in KL_PENALTY_LEVELS:
        problems.add(f"actor.kl_penalty_level '{actor.kl_penalty_level}' is not one of: "
                     f"{', '.join(KL_PENALTY_LEVELS)}", hint="e.g. actor.kl_penalty_level=token")
    _validate_decoupled(actor, problems)
    _validate_sapo_m2po(actor, problems)
    if actor.policy_loss == "gmpo" and actor.loss_agg_mode == "token-mean":
        problems.add("actor.policy_loss gmpo with actor.loss_agg_mode token-mean: GMPO's loss is one value per "
                     "sequence (its advantage times the geometric mean of its token ratios), averaged over the "
                     "sequences, as verl's geo_mean does whatever its loss_agg_mode",
                     hint="set actor.loss_agg_mode=seq-mean-token-mean (the KL loss term and the entropy bonus are "
                          "then averaged per sequence too)")


def _validate_norm(field: str, norm: NormConfig, group_size: int, problems: Problems) -> None:
    for level_name in ("mean_level", "std_level"):
        level = getattr(norm, level_name)
        if level not in NORM_LEVELS:
            problems.add(f"{field}.{level_name} '{level}' is not one of: batch, group, null",
                         hint=f"e.g. {field}.{level_name}=group")
    mean = None if norm.mean_level == "none" else norm.mean_level
    std = None if norm.std_level == "none" else norm.std_level
    size = norm.group_size if norm.group_size is not None else group_size
    if "group" in (mean, std) and size >= 1:  # a size below 1 is refused by its range (rlkit.config.ranges)
        if norm.group_size is not None and group_size % norm.group_size:
            problems.add(f"{field}.group_size {norm.group_size} does not divide actor.group_size ({group_size}), so "
                         "its groups would mix prompts", hint=f"remove it or set {field}.group_size={group_size}")
        elif mean == "group" and size < 2:
            problems.add(f"{field}.mean_level group with groups of {size} sample: every value minus its own mean "
                         "is 0, so nothing would be learnt",
                         hint="set gconfig.n_samples and actor.group_size to 2 or more (e.g. 8), or use "
                              f"{field}.mean_level=batch")
    if norm.mean_leave1out and mean is None:
        problems.add(f"{field}.mean_leave1out without a mean_level: there is no mean to leave a sample out of",
                     hint=f"set {field}.mean_level=group, or remove mean_leave1out")
    if std is not None and not norm.eps > 0:
        problems.add(f"{field}.eps must be positive when std_level is set (got {norm.eps}): a flat group's std is "
                     "0, and 0 / 0 is not a number", hint=f"e.g. {field}.eps=1e-5")


def validate_kl_control(actor: ActorConfig, sequences: int, problems: Problems) -> None:
    """actor.kl_ctl_adaptive (the adaptive KL controller, rlkit.trainer.rl_math.kl_controller) needs a coefficient
    to adapt, and a horizon long enough that one step (of `sequences` sequences, 0: unknown) can at most shrink the
    coefficient, never flip it: 1 - 0.2 x sequences / horizon must stay above 0, else the penalty becomes a KL
    bonus."""
    control = actor.kl_ctl_adaptive
    if control is None:
        return
    if actor.kl_ctl == 0:
        problems.add("actor.kl_ctl_adaptive is set, but actor.kl_ctl (its starting coefficient) is 0: the controller "
                     "multiplies the coefficient, so it would stay 0 and no KL penalty would be on",
                     hint="set actor.kl_ctl > 0 (e.g. 0.001, verl's kl_ctrl.kl_coef), or remove actor.kl_ctl_adaptive")
    smallest = math.floor(KL_CONTROL_ERROR_CLIP * sequences) + 1
    if sequences > 0 and control.horizon >= 1 and control.horizon < smallest:  # below 1: refused by its range
        problems.add(f"actor.kl_ctl_adaptive.horizon {control.horizon} is too short for {sequences} sequences a "
                     "step (train_dataset.batch_size x actor.group_size): a KL under target would multiply the "
                     f"coefficient by 1 - {KL_CONTROL_ERROR_CLIP} x {sequences} / {control.horizon} <= 0, turning "
                     "the penalty into a bonus",
                     hint=f"set actor.kl_ctl_adaptive.horizon to {smallest} or more (verl's default 10000)")


def _validate_decoupled(actor: ActorConfig, problems: Problems) -> None:
    rs = actor.rejection_sampling
    cap = actor.behav_imp_weight_cap
    if cap is not None and rs is not None:
        problems.add("actor.behav_imp_weight_cap and actor.rejection_sampling are both set: the cap is the older "
                     "AReaL form of the same bound", hint="keep only actor.rejection_sampling (the cap equals "
                                                          "{level: token, action: mask, metric: ratio, upper: cap})")
    if (cap is not None or rs is not None) and not actor.use_decoupled_loss:
        which = "actor.behav_imp_weight_cap" if cap is not None else "actor.rejection_sampling"
        problems.add(f"{which} bounds the decoupled loss's behaviour weight, but actor.use_decoupled_loss is false, "
                     "so it would be ignored", hint=f"set actor.use_decoupled_loss=true, or remove {which}")
    method = actor.prox_logp_method
    if method != "recompute" and method in PROX_LOGP_METHODS and not actor.use_decoupled_loss:
        # AReaL ignores it then; only the decoupled loss has a proximal policy
        problems.add(f"actor.prox_logp_method {method} says how the decoupled loss gets its proximal policy, but "
                     "actor.use_decoupled_loss is false, so it would be ignored",
                     hint="set actor.use_decoupled_loss=true, or remove actor.prox_logp_method")
    if actor.use_decoupled_loss and not actor.recompute_logprob and method != "loglinear":
        problems.add("actor.use_decoupled_loss needs actor.recompute_logprob=true: the proximal policy is the "
                     "recomputed log-probs", hint="set actor.recompute_logprob=true, or actor.prox_logp_method="
                                                  "loglinear to approximate them without the forward pass")
    if cap is not None and not cap > 1:  # not a plain range: the reason matters more than the bound
        problems.add(f"actor.behav_imp_weight_cap must be > 1 (got {cap}): a lower cap drops on-policy tokens",
                     hint="e.g. actor.behav_imp_weight_cap=5")
    if rs is not None:
        _validate_rejection(rs, problems)


def _validate_sapo_m2po(actor: ActorConfig, problems: Problems) -> None:
    """SAPO excludes what AReaL says it excludes (the decoupled loss) and the clip knobs it would ignore; M2PO bounds
    the behaviour weight, which exists only under the decoupled loss (AReaL's mask is all-keep without it)."""
    if actor.use_sapo_loss:
        if actor.use_decoupled_loss:
            problems.add("actor.use_sapo_loss is not compatible with actor.use_decoupled_loss=true (as in AReaL): "
                         "SAPO's gate has no behaviour weight", hint="set actor.use_decoupled_loss=false, or remove "
                                                                    "actor.use_sapo_loss")
        for name in ("eps_clip_higher", "c_clip"):
            if getattr(actor, name) is not None:
                problems.add(f"actor.{name} is a bound of PPO's clip, which SAPO's soft gate replaces, so it would be "
                             "ignored", hint=f"remove actor.{name}, or set actor.use_sapo_loss=false")
    if actor.m2_threshold is not None and not actor.use_decoupled_loss:
        problems.add("actor.m2_threshold masks tokens by the behaviour weight pi_prox / pi_behav, which only the "
                     "decoupled loss has (AReaL's mask keeps every token without it), so it would do nothing",
                     hint="set actor.use_decoupled_loss=true, or remove actor.m2_threshold")


def _validate_rejection(rs: RejectionSamplingConfig, problems: Problems) -> None:
    field = "actor.rejection_sampling"
    for name, choices in RS_CHOICES.items():
        value = getattr(rs, name)
        if value not in choices:
            problems.add(f"{field}.{name} '{value}' is not one of: {', '.join(choices)}",
                         hint=f"e.g. {field}.{name}={choices[0]}")
    if rs.lower is not None and rs.lower > rs.upper:
        problems.add(f"{field}.lower ({rs.lower}) is above {field}.upper ({rs.upper})")
    if rs.metric == "ratio":
        if not rs.upper > 1:
            problems.add(f"{field}.upper must be > 1 for metric ratio (got {rs.upper}): every token whose policy "
                         "moved at all would be dropped", hint=f"e.g. {field}.upper=5")
        if rs.lower is not None and not rs.lower > 0:
            problems.add(f"{field}.lower must be positive for metric ratio (got {rs.lower})")
    elif rs.metric in ("kl_k2", "kl_k3") and not rs.upper > 0:
        problems.add(f"{field}.upper must be positive for metric {rs.metric} (got {rs.upper})")
    if rs.action == "clamp" and rs.metric != "ratio":
        problems.add(f"{field}.action clamp bounds the importance weight itself, so it needs metric ratio "
                     f"(got {rs.metric})", hint=f"use {field}.action=mask for a KL metric")
