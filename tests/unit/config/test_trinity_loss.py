"""`rlkit migrate` of Trinity-RFT's policy loss (rlkit.config.trinity_loss): algorithm.policy_loss_fn was left out
whatever it named ("set by the job type"), so a file asking for CISPO trained PPO's clip, and the algorithm types cispo
and gspo had no job type. Each loss now moves where rlkit's computes the same (with Trinity-RFT's defaults written)
and is refused naming what differs where it does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlkit.errors import ConfigError
from tests.unit.config.test_trinity_migrate import _to_rlkit, _trinity, migrated_config

GRPO = {"algorithm.algorithm_type": "grpo", "algorithm.advantage_fn_args": None}
ARGS = "algorithm.policy_loss_fn_args"
VERL_ACTOR = "trainer.trainer_config.actor_rollout_ref.actor"


def _migrated(tmp_path: Path, **changes: Any) -> tuple[Any, dict[str, str]]:
    return migrated_config(tmp_path, _trinity(**changes))


def test_algorithm_type_cispo_is_grpo_with_cispo_and_trinity_defaults(tmp_path: Path) -> None:
    """CISPOAlgorithm: GRPO's advantages, policy_loss_fn cispo, whose bounds default to clip_range_low 1.0 (no floor)
    and clip_range_high 0.28; the migrated file loads and renders."""
    config, fates = _migrated(tmp_path, **{**GRPO, "algorithm.algorithm_type": "cispo"})
    actor = config.actor
    assert (config.type, actor.policy_loss, actor.eps_clip, actor.eps_clip_higher) == ("grpo", "cispo", 1.0, 0.28)
    assert fates["algorithm.algorithm_type"].startswith("moved to type as grpo (GRPO's advantages")
    assert fates["algorithm.policy_loss_fn"].startswith("moved to actor.policy_loss as cispo (algorithm_type "
                                                        "cispo's default)")
    assert fates[f"{ARGS}.clip_range_high"] == ("moved to actor.eps_clip_higher as 0.28, Trinity-RFT's cispo "
                                                 "default")


def test_policy_loss_fn_cispo_is_no_longer_dropped(tmp_path: Path) -> None:
    """grpo with policy_loss_fn cispo trained PPO's clip after migration; its bounds are cispo's (the unset side
    CISPO's constructor default), its mask off left out naming why."""
    config, fates = _migrated(tmp_path, **GRPO, **{"algorithm.policy_loss_fn": "cispo", ARGS: {
        "clip_range_high": 0.5, "enable_mask_clip": False, "mask_clip_range_high": 0.3}})
    actor = config.actor
    assert (config.type, actor.policy_loss, actor.eps_clip, actor.eps_clip_higher) == ("grpo", "cispo", 1.0, 0.5)
    assert fates[f"{ARGS}.mask_clip_range_high"] == "left out (read with enable_mask_clip only, which is off)"
    assert fates[f"{ARGS}.clip_range_low"].endswith("as 1.0, Trinity-RFT's cispo default")


def test_algorithm_type_gspo_is_grpo_with_the_sequence_ratio_averaged_by_sequence(tmp_path: Path) -> None:
    """GSPO-token's loss is GSPO's sequence ratio averaged over each sequence's tokens, then the sequences, whatever
    loss_agg_mode says; its bounds are default_args' 0.0003 / 0.0004 when the file has no policy_loss_fn_args."""
    config, fates = _migrated(tmp_path, **{**GRPO, "algorithm.algorithm_type": "gspo",
                                           "algorithm.loss_agg_mode": "token-mean"})
    actor = config.actor
    assert (config.type, actor.importance_sampling_level, actor.loss_agg_mode) == ("grpo", "sequence",
                                                                                    "seq-mean-token-mean")
    assert (actor.policy_loss, actor.eps_clip, actor.eps_clip_higher) == ("ppo", 0.0003, 0.0004)
    assert "whatever it says" in fates["algorithm.loss_agg_mode"]
    # with policy_loss_fn_args, default_args is not applied: clip_range is both sides
    config, _ = _migrated(tmp_path, **GRPO, **{"algorithm.policy_loss_fn": "gspo", ARGS: {"clip_range": 0.001}})
    assert (config.actor.eps_clip, config.actor.eps_clip_higher) == (0.001, 0.001)


def test_ppo_reads_its_dual_clip_and_its_policy_gradient_fallback(tmp_path: Path) -> None:
    """ppo's clip_ratio_c was dropped ("no such key"): it is actor.c_clip; fallback_to_policy_gradient makes the
    ratio 1 (gradient -A grad log pi): rlkit's gpg, the clip keys left out."""
    config, fates = _migrated(tmp_path, **GRPO, **{ARGS: {"clip_range": 0.2, "clip_ratio_c": 3.0}})
    assert (config.actor.policy_loss, config.actor.c_clip, config.actor.eps_clip) == ("ppo", 3.0, 0.2)
    config, fates = _migrated(tmp_path, **GRPO, **{ARGS: {"clip_range": 0.2, "fallback_to_policy_gradient": True}})
    assert config.actor.policy_loss == "gpg"
    assert fates[f"{ARGS}.clip_range"] == "left out (fallback_to_policy_gradient: the ratio is 1, nothing is clipped)"


@pytest.mark.parametrize("changes, says", [
    ({"algorithm.algorithm_type": "sapo"}, r"has no rlkit job type: Trinity-RFT's sapo .*2/tau times the policy "
                                           r"gradient at r = 1"),
    ({"algorithm.policy_loss_fn": "sapo"}, r"policy_loss_fn 'sapo' with algorithm_type grpo .*differentiates the "
                                           "gate"),
    ({"algorithm.policy_loss_fn": "topr"}, "TOPR's loss"),
    ({"algorithm.policy_loss_fn": "m2po"}, r"m2po drops, of the tokens where PPO's clip would bind .*keeps PPO's clip"),
    ({"algorithm.algorithm_type": "rloo"}, "RLOO's advantages"),
    ({"algorithm.algorithm_type": "opmd", "algorithm.policy_loss_fn": "cispo"}, "algorithm_type opmd has a loss of "
                                                                                "its own"),
    ({"algorithm.policy_loss_fn": "cispo", ARGS: {"clip_range": 0.2}}, "cispo takes clip_range_low and "
                                                                       "clip_range_high"),
    ({"algorithm.policy_loss_fn": "cispo", ARGS: {"enable_mask_clip": True}}, "no mask dropping the tokens"),
    ({"algorithm.policy_loss_fn": "gspo", ARGS: {"clip_range_low": 0.001}}, "gspo needs clip_range or both"),
    ({"algorithm.algorithm_type": "ppo", "algorithm.policy_loss_fn": "gspo"}, "GAE's advantages differ token by "
                                                                               "token"),
    ({ARGS: {"enable_sequence_masking": True}}, "no masking of the negative-advantage tokens"),
    ({ARGS: {"clip_ratio_c": 1.0}}, "clip_ratio_c 1.0 .* not a number > 1"),
])
def test_losses_rlkit_computes_otherwise_are_refused_naming_what_differs(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        _to_rlkit(_trinity(**{**GRPO, **changes}), "t")


def test_verls_loss_mode_in_the_embedded_config_is_not_read(tmp_path: Path) -> None:
    """Trinity-RFT's actor computes its loss with policy_loss_fn: verl's loss_mode cispo, which rlkit moves in verl's
    own runs (rlkit.config.verl.policy_loss), is left out naming Trinity-RFT's key and its name of the loss."""
    config, fates = _migrated(tmp_path, **GRPO, **{f"{VERL_ACTOR}.policy_loss.loss_mode": "cispo",
                                                   f"{VERL_ACTOR}.clip_ratio_c": 10.0})
    assert (config.actor.policy_loss, config.actor.c_clip) == ("ppo", None)
    assert fates[f"{VERL_ACTOR}.policy_loss.loss_mode"] == (
        "left out (not read: Trinity-RFT's trainer takes it from algorithm.policy_loss_fn (verl's cispo is its cispo))")
    assert fates[f"{VERL_ACTOR}.clip_ratio_c"].endswith("algorithm.policy_loss_fn_args.clip_ratio_c)")
