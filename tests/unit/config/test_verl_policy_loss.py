"""`rlkit migrate` of verl's loss modes cispo, geo_mean and gpg: each becomes actor.policy_loss (cispo, gmpo, gpg)
with verl's clip keys as its bounds where its loss reads them, the others left out saying why, GMPO's mean over
sequences written as a seq-mean actor.loss_agg_mode; the migrated file loads and passes the submit checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlkit.config.verl.rules import verl_to_rlkit
from rlkit.jobs import REGISTRY
from tests.unit.config.test_verl_estimators import _actor_of

MODE = "actor_rollout_ref.actor.policy_loss.loss_mode"
LOW, HIGH, DUAL = (f"actor_rollout_ref.actor.clip_ratio{s}" for s in ("_low", "_high", "_c"))
AGG = "actor_rollout_ref.actor.loss_agg_mode"


def _mapped(**leaves: Any) -> tuple[dict[str, Any], dict[str, str]]:
    mapping, fates = verl_to_rlkit({"algorithm.adv_estimator": "grpo", **{k.replace("__", "."): v for k, v in
                                                                          leaves.items()}},
                                   "t", REGISTRY.verl_estimators)
    return mapping["actor"], {f.key: f.fate for f in fates}


def test_cispo_takes_the_clip_keys_as_its_weight_s_bounds() -> None:
    """verl's cispo example: clip_ratio_low 10 (no lower bound), clip_ratio_high 0.2; no dual clip in CISPO."""
    actor, said = _mapped(**{MODE: "cispo", LOW: 10, HIGH: 0.2, DUAL: 3.0})
    assert (actor["policy_loss"], actor["eps_clip"], actor["eps_clip_higher"]) == ("cispo", 10, 0.2)
    assert "c_clip" not in actor and said[DUAL] == "left out (verl's cispo loss has no dual clip)"
    assert said[MODE].startswith("moved to actor.policy_loss cispo (the weight clipped to [1 - eps_clip"), said[MODE]


@pytest.mark.parametrize(("extra", "agg", "says"), [
    ({}, "seq-mean-token-mean", "(no KL loss term or entropy bonus reads it here) (token-mean: verl's default)"),
    ({"actor_rollout_ref.actor.use_kl_loss": True, AGG: "token-mean"}, "seq-mean-token-mean",
     "rlkit averages the KL loss term and the entropy bonus so too, where verl's token-mean weighs them by tokens"),
    ({AGG: "seq-mean-token-sum"}, "seq-mean-token-sum", "moved to actor.loss_agg_mode"),
])
def test_geo_mean_is_gmpo_averaged_over_sequences(extra: dict[str, Any], agg: str, says: str) -> None:
    actor, said = _mapped(**{MODE: "geo_mean", LOW: 0.4, HIGH: 0.4, **extra})
    assert (actor["policy_loss"], actor["eps_clip"], actor["eps_clip_higher"]) == ("gmpo", 0.4, 0.4)
    assert actor["loss_agg_mode"] == agg
    assert says in said[AGG], said[AGG]


def test_gpg_leaves_the_clip_keys_out() -> None:
    actor, said = _mapped(**{MODE: "gpg", LOW: 0.2, HIGH: 0.28, DUAL: 3.0, "actor_rollout_ref.actor.clip_ratio": 0.2})
    assert actor["policy_loss"] == "gpg"
    assert not {"eps_clip", "eps_clip_higher", "c_clip"} & set(actor)
    assert said[LOW] == said[HIGH] == "left out (verl's gpg loss has no ratio to clip)"


@pytest.mark.parametrize(("words", "want"), [
    (f"{MODE}=cispo {LOW}=10", ("cispo", 10.0, 0.28, "token-mean")),  # the script's own clip_ratio_high=0.28
    (f"{MODE}=geo_mean {LOW}=0.4", ("gmpo", 0.4, 0.28, "seq-mean-token-mean")),
    (f"algorithm.adv_estimator=gpg {MODE}=gpg", ("gpg", 0.2, None, "token-mean")),
])
def test_a_migrated_script_loads_and_passes_the_checks(tmp_path: Path, site: list[str], words: str,
                                                       want: tuple[Any, ...]) -> None:
    """GRPO_SCRIPT with the loss mode (its KL loss is on, its clip_ratio_high 0.28; gpg leaves that out)."""
    if not words.startswith("algorithm."):
        words = f"algorithm.adv_estimator=grpo {words}"
    actor, said, _ = _actor_of(tmp_path, site, words)
    assert (actor.policy_loss, actor.eps_clip, actor.eps_clip_higher, actor.loss_agg_mode) == want
    assert said[MODE].startswith(f"moved to actor.policy_loss {want[0]}"), said[MODE]
