"""Trinity-RFT's policy loss (algorithm.policy_loss_fn, its policy_loss_fn_args, and the algorithm types that are a
policy loss on GRPO's advantages) as rlkit's, for `rlkit migrate` (rlkit.config.trinity). A loss moves where rlkit's
computes the same thing (same clip bounds, detach points, aggregation and defaults) and is refused naming what differs
where it does not: the key was once left out whatever its value, so a file asking for CISPO trained PPO's clip.

Trinity-RFT's code decides (trinity/algorithm/policy_loss_fn/*.py, algorithm.py's default_config, config_validator's
AlgorithmConfigValidator): policy_loss_fn defaults to the algorithm type's; policy_loss_fn_args gets the loss's
default_args() only when the file leaves the whole section out (set_if_none), else the constructor's own defaults.

- ppo: rlkit's PPO clip (actor.policy_loss ppo); clip_ratio_c, read by the releases with a dual clip, is actor.c_clip;
  fallback_to_policy_gradient replaces the ratio by exp(log pi - sg(log pi)) = 1, whose gradient is -A grad log pi:
  rlkit's gpg.
- cispo: -A sg(clip(r, 1 - clip_range_low, 1 + clip_range_high)) log pi, rlkit's cispo with eps_clip /
  eps_clip_higher (defaults 1.0 and 0.28: no floor, the paper's cap).
- gspo (GSPO-token): each token's ratio exp(log pi - sg(log pi) + sg(mean log-ratio of its sequence)), clipped as PPO,
  the mean over each sequence's tokens then over the sequences whatever loss_agg_mode says: rlkit's
  importance_sampling_level sequence with seq-mean-token-mean (the same value and, the advantage being one per
  sequence as GRPO's is, the same gradient); defaults clip_range_low 0.0003, clip_range_high 0.0004.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlkit.config.dotted import finite_number
from rlkit.config.problems import Problems
from rlkit.config.trinity_terms import Left, Moved, Put

TYPE = "algorithm.algorithm_type"
FN = "algorithm.policy_loss_fn"
ARGS = "algorithm.policy_loss_fn_args."
AGG_KEYS = ("algorithm.loss_agg_mode", f"{ARGS}loss_agg_mode")
# algorithm_type -> its default policy_loss_fn (Trinity-RFT's default_config), for the types rlkit runs
DEFAULT_FN = {"ppo": "ppo", "grpo": "ppo", "cispo": "cispo", "gspo": "gspo", "opmd": "opmd", "mix": "mix"}
CLIPPED = ("ppo", "grpo", "cispo", "gspo")  # the types whose rlkit job (grpo, ppo) takes actor.policy_loss
CLIPPED_FNS = ("ppo", "cispo", "gspo")
CISPO_DEFAULTS = {"clip_range_low": 1.0, "clip_range_high": 0.28}  # CISPOPolicyLossFn's default_args and __init__
GSPO_DEFAULTS = {"clip_range_low": 0.0003, "clip_range_high": 0.0004}  # GSPOLossFn.default_args (no __init__ one)
SAPO_DIFFERS = ("Trinity-RFT's sapo multiplies log pi by the gate taken as a constant, -A sg(f(r)) log pi: its "
                "gradient (4/tau) sigmoid(tau (r - 1)) A grad log pi is 2/tau times the policy gradient at r = 1 and "
                "grows with r; rlkit's use_sapo_loss (AReaL's and verl's SAPO) differentiates the gate, "
                "sech^2(tau (r - 1) / 2) r A grad log pi: the policy gradient at r = 1, fading as r leaves 1")
# policy_loss_fn -> what rlkit lacks, for the names of Trinity-RFT's POLICY_LOSS_FN registry it does not take
LOSS_NOT_BUILT = {
    "sapo": SAPO_DIFFERS,
    "topr": "TOPR's loss (truncated importance weights on the negative samples only) is not one of rlkit's",
    "sppo": "sPPO's loss is not one of rlkit's",
    "rec": "REC's loss (its own clipping and regularisation of off-policy samples) is not one of rlkit's",
    "importance_sampling": "a plain importance-weighted loss without PPO's clip is not one of rlkit's",
    "m2po": "Trinity-RFT's m2po drops, of the tokens where PPO's clip would bind (A > 0 with r > 1, A < 0 with "
            "r < 1, r = pi / pi_old), those of largest (log r)^2 and clips none of the rest (-A r, its mean over every "
            "token); rlkit's actor.m2_threshold (AReaL's M2PO) drops by (log pi_prox / pi_behav)^2 over every token "
            "under the decoupled loss, keeps PPO's clip and averages over the tokens kept",
    "sft_is": "CHORD's importance-weighted SFT loss is not one of rlkit's",
    "sft_phi": "CHORD's phi-weighted SFT loss is not one of rlkit's",
    "mix_chord": "CHORD's mix (a scheduled SFT weight and a per-token phi weight) is not rlkit's mix (a fixed mix.mu)",
    "sft": "the SFT loss on the rollouts (RAFT) is not built for rlkit's RL jobs",
    "dpo": "dpo is a trainer-only job: use algorithm_type dpo with mode train",
}
# algorithm_type -> what rlkit lacks, for the types of Trinity-RFT's ALGORITHM_TYPE registry it does not take
ALGORITHM_NOT_BUILT = {
    "sapo": SAPO_DIFFERS,
    "dapo": "its dynamic sampling and overlong reward shaping are keys rlkit's Trinity-RFT reading has not checked "
            "(the loss is PPO's clip on GRPO's advantages: algorithm_type grpo with kl_loss_fn none, and rlkit's "
            "actor.dynamic_sampling and actor.overlong_* set yourself, is that run)",
    "reinforceplusplus": "REINFORCE++'s advantages (advantage_fn reinforceplusplus) are not read from Trinity-RFT "
                         "files (verl's reinforce_plus_plus estimator is: coming from verl)",
    "rloo": "RLOO's advantages (advantage_fn rloo) are not read from Trinity-RFT files (verl's rloo estimator is: "
            "coming from verl)",
    "topr": LOSS_NOT_BUILT["topr"],
    "asymre": "AsymRE's advantages (advantage_fn asymre) are not rlkit's",
    "raft": LOSS_NOT_BUILT["sft"],
    "sppo": LOSS_NOT_BUILT["sppo"],
    "rec": LOSS_NOT_BUILT["rec"],
    "mix_chord": LOSS_NOT_BUILT["mix_chord"],
    "multi_step_grpo": "step-wise GRPO's advantages over a multi-turn episode's steps are not rlkit's",
    "gigpo": "GiGPO's anchor-state step-level advantages are not rlkit's",
}

Fate = Callable[[str, Any, str], None]  # (Trinity-RFT key, its value or "(unset)", what became of it)


def policy_loss(leaves: dict[str, Any], moved: Moved, left: Left, put: Put, fate: Fate, problems: Problems,
                source: str) -> set[str]:
    """Judge policy_loss_fn (named or the algorithm type's default) and the arguments its loss reads; the clip range
    of ppo is left to rlkit.config.trinity_knobs. Returns the keys judged here."""
    kind = leaves.get(TYPE, "ppo")
    if not isinstance(kind, str) or kind not in DEFAULT_FN:
        return set()  # refused by algorithm_type's reading
    fn = leaves.get(FN) or DEFAULT_FN[kind]
    judged = {FN} & set(leaves)
    if kind not in CLIPPED or not isinstance(fn, str) or fn not in CLIPPED_FNS:
        if fn == DEFAULT_FN[kind]:
            if FN in leaves:
                left(FN, f"{fn}: the loss of algorithm_type {kind}, set by the job type")
            return judged
        args = {k for k in leaves if k.startswith(ARGS)}
        why = LOSS_NOT_BUILT.get(str(fn), "not one of Trinity-RFT's policy loss functions rlkit takes")
        if kind not in CLIPPED and isinstance(fn, str) and fn in CLIPPED_FNS:
            why = f"algorithm_type {kind} has a loss of its own ({DEFAULT_FN[kind]}), in rlkit as in Trinity-RFT"
        problems.add(f"{FN} {fn!r} with algorithm_type {kind} ({source}): {why}",
                     hint=f"use {' or '.join(CLIPPED_FNS) if kind in CLIPPED else DEFAULT_FN[kind]} (or leave "
                          "policy_loss_fn out)")
        return judged | args
    said = "" if FN in leaves else f" (algorithm_type {kind}'s default)"
    if fn == "gspo" and kind == "ppo":
        problems.add(f"{FN} 'gspo' with algorithm_type ppo ({source}): GAE's advantages differ token by token, and "
                     "Trinity-RFT's GSPO-token weighs each token by its own where rlkit's sequence ratio takes the "
                     "sequence's mean advantage", hint="use algorithm_type gspo (GRPO's advantages, one a sequence)")
        return judged | {k for k in leaves if k.startswith(ARGS)}
    if fn == "ppo":
        return judged | _ppo(leaves, moved, left, problems, source, said)
    if fn == "cispo":
        _record(leaves, moved, fate, FN, "actor.policy_loss", "cispo", f"{said}: -A sg(clip(r)) log pi, the "
                "weight clipped to [1 - eps_clip, 1 + eps_clip_higher]")
        return judged | _cispo(leaves, moved, left, put, fate, problems, source)
    _record(leaves, moved, fate, FN, "actor.importance_sampling_level", "sequence", f"{said}: GSPO's sequence "
            "ratio (Trinity-RFT's GSPO-token: the same value, and the same gradient for GRPO's one advantage a "
            "sequence), averaged over each sequence's tokens then over the sequences (actor.loss_agg_mode "
            "seq-mean-token-mean)")
    return judged | _gspo(leaves, moved, left, put, fate, problems, source)


def _record(leaves: dict[str, Any], moved: Moved, fate: Fate, key: str, to: str, value: Any, how: str) -> None:
    """The fate of `key` moved to `to` as `value` (absent from the file: the algorithm type's default); the value
    itself is written by the loss's reading."""
    if key in leaves:
        moved(key, to, value, f" as {value}{how}")
    else:
        fate(key, "(unset)", f"moved to {to} as {value}{how}")


def _ppo(leaves: dict[str, Any], moved: Moved, left: Left, problems: Problems, source: str, said: str) -> set[str]:
    """ppo's arguments beyond its clip range: the dual clip, sequence masking and the policy-gradient fallback."""
    if FN in leaves:
        left(FN, f"ppo{said}: rlkit's PPO clip loss (actor.policy_loss ppo), the default")
    keys = {name: f"{ARGS}{name}" for name in ("clip_ratio_c", "enable_sequence_masking", "delta_sequence_masking",
                                              "fallback_to_policy_gradient")}
    judged = {k for k in keys.values() if k in leaves}
    fallback = leaves.get(keys["fallback_to_policy_gradient"], False)
    masking = leaves.get(keys["enable_sequence_masking"], False)
    if masking not in (False, None):
        problems.add(f"{keys['enable_sequence_masking']} {masking!r} ({source}): rlkit has no masking of the "
                     "negative-advantage tokens of sequences whose KL passes delta_sequence_masking",
                     hint="set it false (or leave it out)")
    elif keys["enable_sequence_masking"] in leaves:
        left(keys["enable_sequence_masking"], "off")
    if keys["delta_sequence_masking"] in leaves and masking in (False, None):
        left(keys["delta_sequence_masking"], "read with enable_sequence_masking only, which is off")
    if fallback not in (False, None):
        if fallback is not True:
            problems.add(f"{keys['fallback_to_policy_gradient']} {fallback!r} ({source}) is not true or false",
                         hint="fallback_to_policy_gradient: true")
            return judged
        moved(keys["fallback_to_policy_gradient"], "actor.policy_loss", "gpg", " as gpg: the ratio exp(log pi - "
              "sg(log pi)) is 1, so the loss's gradient is -A grad log pi, rlkit's gpg")
        clip = {k for k in leaves if k.startswith(ARGS) and k.rsplit(".", 1)[1] in ("clip_range", "clip_range_low",
                                                                                 "clip_range_high", "clip_ratio_c")}
        for key in clip:
            left(key, "fallback_to_policy_gradient: the ratio is 1, nothing is clipped")
        return judged | clip
    if keys["fallback_to_policy_gradient"] in leaves:
        left(keys["fallback_to_policy_gradient"], "off")
    if keys["clip_ratio_c"] in leaves:
        value = leaves[keys["clip_ratio_c"]]
        if not finite_number(value) or value <= 1:
            problems.add(f"{keys['clip_ratio_c']} {value!r} ({source}) is not a number > 1", hint="e.g. 3.0")
        else:
            moved(keys["clip_ratio_c"], "actor.c_clip", value, " (the dual clip of negative advantages)")
    return judged


def _cispo(leaves: dict[str, Any], moved: Moved, left: Left, put: Put, fate: Fate, problems: Problems,
           source: str) -> set[str]:
    """CISPO's bounds (Trinity-RFT's defaults where unset) and its mask clip, which rlkit does not have."""
    put("actor.policy_loss", "cispo")
    args = {k.removeprefix(ARGS): k for k in leaves if k.startswith(ARGS)}
    judged = {args[name] for name in ("clip_range", "clip_range_low", "clip_range_high", "enable_mask_clip",
                                      "mask_clip_range_low", "mask_clip_range_high") if name in args}
    if "clip_range" in args:
        problems.add(f"{args['clip_range']} ({source}): Trinity-RFT's cispo takes clip_range_low and clip_range_high "
                     "(its constructor has no clip_range)", hint="give the bounds as clip_range_low and "
                                                                 "clip_range_high (rlkit's eps_clip, eps_clip_higher)")
    _bounds(leaves, moved, put, fate, problems, source, args, CISPO_DEFAULTS, "cispo")
    mask = leaves.get(f"{ARGS}enable_mask_clip", False)
    if mask not in (False, None):
        problems.add(f"{ARGS}enable_mask_clip {mask!r} ({source}): rlkit's cispo has no mask dropping the tokens "
                     "whose ratio passes mask_clip_range on the advantage's side", hint="set it false (or leave it "
                                                                                       "out)")
    for name in ("enable_mask_clip", "mask_clip_range_low", "mask_clip_range_high"):
        if name in args and mask in (False, None):
            left(args[name], "off" if name == "enable_mask_clip" else "read with enable_mask_clip only, which is off")
    return judged


def _gspo(leaves: dict[str, Any], moved: Moved, left: Left, put: Put, fate: Fate, problems: Problems,
          source: str) -> set[str]:
    """GSPO's bounds (default_args only when policy_loss_fn_args is unset: its constructor has none) and its mean
    over sequences, which ignores loss_agg_mode."""
    put("actor.importance_sampling_level", "sequence")
    put("actor.loss_agg_mode", "seq-mean-token-mean")
    args = {k.removeprefix(ARGS): k for k in leaves if k.startswith(ARGS)}
    judged = {args[name] for name in ("clip_range", "clip_range_low", "clip_range_high") if name in args}
    for key in AGG_KEYS:
        if key in leaves:
            judged.add(key)
            left(key, "Trinity-RFT's gspo averages over each sequence's tokens, then over the sequences, whatever "
                      "it says: actor.loss_agg_mode seq-mean-token-mean, which rlkit's KL loss term and entropy bonus "
                      "read too")
    base: Any = leaves.get(args.get("clip_range", ""))
    if "clip_range" in args and (not finite_number(base) or base < 0):
        problems.add(f"{args['clip_range']} {base!r} ({source}) is not a number >= 0", hint="e.g. 0.0003")
    elif args:
        if "clip_range" in args and not {"clip_range_low", "clip_range_high"} <= set(args):
            _bounds(leaves, moved, put, fate, problems, source, args, {"clip_range_low": base, "clip_range_high": base},
                    "gspo", from_range=True)
        elif {"clip_range_low", "clip_range_high"} <= set(args):
            if "clip_range" in args:
                left(args["clip_range"], "clip_range_low and clip_range_high, both set, win")
            _bounds(leaves, moved, put, fate, problems, source, args, {}, "gspo")
        else:
            problems.add(f"{ARGS[:-1]} ({source}): Trinity-RFT's gspo needs clip_range or both clip_range_low and "
                         "clip_range_high once policy_loss_fn_args is given (its defaults apply only to a file "
                         "without the section)", hint="e.g. clip_range_low: 0.0003, clip_range_high: 0.0004")
    else:
        _bounds(leaves, moved, put, fate, problems, source, args, GSPO_DEFAULTS, "gspo")
    return judged


def _bounds(leaves: dict[str, Any], moved: Moved, put: Put, fate: Fate, problems: Problems, source: str,
            args: dict[str, str], defaults: dict[str, Any], loss: str, from_range: bool = False) -> None:
    """clip_range_low and clip_range_high as actor.eps_clip and actor.eps_clip_higher, `defaults` where unset."""
    for name, to in (("clip_range_low", "actor.eps_clip"), ("clip_range_high", "actor.eps_clip_higher")):
        if name in args:
            value = leaves[args[name]]
            if not finite_number(value) or value < 0:
                problems.add(f"{args[name]} {value!r} ({source}) is not a number >= 0", hint="e.g. 0.2")
            else:
                moved(args[name], to, value, "")
        elif from_range:
            moved(args["clip_range"], to, defaults[name], f" ({name}'s default)")
        else:
            put(to, defaults[name])
            fate(f"{ARGS}{name}", "(unset)", f"moved to {to} as {defaults[name]}, Trinity-RFT's {loss} default")
