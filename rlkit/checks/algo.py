"""Submit-time checks of the reward, advantage, KL and loss knobs (issue 17): refuse what has no meaning.

AReaL's own checks (NormConfig and RejectionSamplingConfig `__post_init__` at 4aef98d8) are here, plus the
combinations AReaL accepts but ignores or turns into a division by zero. Every problem names its field and fix.
"""

from __future__ import annotations

from rlkit.config.problems import Problems
from rlkit.config.schema.actor import ActorConfig, NormConfig, RejectionSamplingConfig

NORM_LEVELS = ("batch", "group", None, "none")
KL_ESTIMATORS = ("k1", "k2", "k3")
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
    for name in ("kl_estimator", "kl_loss_type"):
        value = getattr(actor, name)
        if value not in KL_ESTIMATORS:
            problems.add(f"actor.{name} '{value}' is not one of: k1, k2, k3", hint=f"e.g. actor.{name}=k3")
    _validate_decoupled(actor, problems)


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
    if actor.use_decoupled_loss and not actor.recompute_logprob:
        problems.add("actor.use_decoupled_loss needs actor.recompute_logprob=true: the proximal policy is the "
                     "recomputed log-probs", hint="set actor.recompute_logprob=true")
    if cap is not None and not cap > 1:  # not a plain range: the reason matters more than the bound
        problems.add(f"actor.behav_imp_weight_cap must be > 1 (got {cap}): a lower cap drops on-policy tokens",
                     hint="e.g. actor.behav_imp_weight_cap=5")
    if rs is not None:
        _validate_rejection(rs, problems)


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
