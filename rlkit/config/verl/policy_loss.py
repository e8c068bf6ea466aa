"""verl's actor.policy_loss.loss_mode as rlkit's policy loss, for `rlkit migrate`: vanilla is rlkit's default (PPO's
clip), gspo its sequence ratio, sapo its gate, cispo, geo_mean and gpg actor.policy_loss cispo, gmpo and gpg.

verl's clip keys stay rlkit's eps_clip / eps_clip_higher (the key map's rows) where the loss reads them: CISPO's
weight is clipped to [1 - clip_ratio_low, 1 + clip_ratio_high], GMPO's log-ratio to [-low, high], as in rlkit. What
the loss does not read is left out, said why (rlkit refuses those knobs under a loss that ignores them): GPG clips
nothing, and only vanilla reads clip_ratio_c. verl's geo_mean averages its loss over the sequences whatever its
loss_agg_mode, which rlkit's gmpo asks to be said: a seq-mean mode (token-mean becomes seq-mean-token-mean).
"""

from __future__ import annotations

from rlkit.config.verl.mapping import RunMapping, put

ACTOR = "actor_rollout_ref.actor"
MODE_KEY = f"{ACTOR}.policy_loss.loss_mode"
AGG_KEY = f"{ACTOR}.loss_agg_mode"
CLIP_KEYS = (f"{ACTOR}.clip_ratio", f"{ACTOR}.clip_ratio_low", f"{ACTOR}.clip_ratio_high")
DUAL_CLIP_KEY = f"{ACTOR}.clip_ratio_c"
# verl's loss_mode -> (rlkit key, value), None: rlkit's default loss
LOSS_MODES: dict[str, tuple[str, object] | None] = {
    "vanilla": None, "gspo": ("actor.importance_sampling_level", "sequence"), "sapo": ("actor.use_sapo_loss", True),
    "cispo": ("actor.policy_loss", "cispo"), "geo_mean": ("actor.policy_loss", "gmpo"),
    "gpg": ("actor.policy_loss", "gpg")}
SAID = {"cispo": " (the weight clipped to [1 - eps_clip, 1 + eps_clip_higher], verl's clip_ratio_low/high)",
        "geo_mean": " (GMPO: the log-ratio clipped to [-eps_clip, eps_clip_higher], verl's clip_ratio_low/high)",
        "gpg": " (-A log pi on every minibatch, no ratio, no clip)"}


def loss_mode(m: RunMapping) -> None:
    """actor.policy_loss.loss_mode and what its loss does not read."""
    if MODE_KEY not in m.leaves:
        return
    mode = m.leaves[MODE_KEY]
    if not isinstance(mode, str) or mode not in LOSS_MODES:
        m.refuse(MODE_KEY, "not built in rlkit", f"use {', '.join(list(LOSS_MODES)[:-1])} or {list(LOSS_MODES)[-1]}")
        return
    target = LOSS_MODES[mode]
    if target is None:
        m.left(MODE_KEY, "vanilla: rlkit's PPO clip loss, the default")
        return
    to, value = target
    m.moved(MODE_KEY, to, value, f" {value}{SAID.get(mode, '')}")
    if mode not in SAID:
        return
    if DUAL_CLIP_KEY in m.leaves:
        m.left(DUAL_CLIP_KEY, f"verl's {mode} loss has no dual clip")
    if mode == "gpg":
        for key in CLIP_KEYS:
            if key in m.leaves and key not in m.done:
                m.left(key, "verl's gpg loss has no ratio to clip")
    if mode == "geo_mean":
        _sequence_mean(m)


def _sequence_mean(m: RunMapping) -> None:
    """GMPO's loss is a mean over sequences in verl whatever loss_agg_mode says (which its KL loss term and entropy
    bonus still read); rlkit's gmpo takes a seq-mean actor.loss_agg_mode, so verl's token-mean becomes
    seq-mean-token-mean, said in the header, with what that changes (nothing without those two terms)."""
    agg = m.leaves.get(AGG_KEY, "token-mean")
    if agg != "token-mean":
        return  # a seq-mean mode moves by its row (the same averages as verl's); anything else is refused there
    terms = m.out.get("actor", {}).get("kl_loss_coef", 0) > 0 or _positive(m.leaves.get(f"{ACTOR}.entropy_coeff"))
    said = (" as seq-mean-token-mean: verl's geo_mean averages its loss over the sequences whatever loss_agg_mode says"
            + ("; rlkit averages the KL loss term and the entropy bonus so too, where verl's token-mean weighs them "
               "by tokens" if terms else " (no KL loss term or entropy bonus reads it here)"))
    if AGG_KEY in m.leaves:
        m.moved(AGG_KEY, "actor.loss_agg_mode", "seq-mean-token-mean", said)
    else:
        put(m.out, "actor.loss_agg_mode", "seq-mean-token-mean")
        m.fate(AGG_KEY, f"moved to actor.loss_agg_mode{said} (token-mean: verl's default)")


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0
