"""`rlkit migrate` of the defaults Trinity-RFT's algorithm types carry (trinity/algorithm/algorithm.py default_config,
filled by config_validator's AlgorithmConfigValidator with set_if_none): a file naming no kl_loss_fn trains with a k2
KL loss at kl_coef 0.001 (verl_config's use_kl_loss is kl_loss_fn != "none"), and one naming no algorithm_type is
ppo. The migration left both out: the migrated run had no KL loss, or the file was refused ("'type' is not set")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.config.test_trinity_migrate import _to_rlkit, _trinity, migrated_config

EXPERT = {"buffer.trainer_input.auxiliary_buffers.sft_dataset": {"path": "/tmp/e.jsonl"}}


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "opmd", "cispo", "gspo", "mix"])
def test_a_kl_loss_the_file_does_not_name_is_the_algorithm_type_s_k2(tmp_path: Path, algorithm: str) -> None:
    """Trinity-RFT's k2 at 0.001 for each algorithm type rlkit takes (mix: the validator's base default, its
    default_config naming none); the migrated file loads and renders with the KL loss on, and the header says
    whose default it is."""
    changes: dict[str, Any] = {"algorithm.algorithm_type": algorithm, "algorithm.advantage_fn_args": None,
                               **(EXPERT if algorithm == "mix" else {})}
    config, fates = migrated_config(tmp_path, _trinity(**changes))
    assert (config.actor.kl_loss_type, config.actor.kl_loss_coef) == ("k2", 0.001)
    assert fates["algorithm.kl_loss_fn"] == (
        f"moved to actor.kl_loss_type as k2, Trinity-RFT's default for algorithm_type {algorithm} (its "
        "default_config; the reference model is actor.path); actor.kl_loss_coef 0.001, Trinity-RFT's default")


def test_a_null_kl_loss_fn_is_unset_and_its_args_keep_their_coefficient(tmp_path: Path) -> None:
    """null is what set_if_none fills (not none: off); kl_loss_fn_args without a function are the default
    function's arguments, so their kl_coef is the coefficient."""
    data = _trinity(**{"algorithm.kl_loss_fn_args": {"kl_coef": 0.02}})
    data["algorithm"]["kl_loss_fn"] = None  # written null (with_changes removes a key given None)
    config, fates = migrated_config(tmp_path, data)
    assert (config.actor.kl_loss_type, config.actor.kl_loss_coef) == ("k2", 0.02)
    assert fates["algorithm.kl_loss_fn"].startswith("moved to actor.kl_loss_type as k2, Trinity-RFT's default for "
                                                    "algorithm_type opmd")
    assert fates["algorithm.kl_loss_fn_args.kl_coef"] == "moved to actor.kl_loss_coef"


def test_a_kl_loss_named_none_or_with_kl_coef_0_stays_off() -> None:
    mapping, fates = _to_rlkit(_trinity(**{"algorithm.kl_loss_fn": "none"}), "t")
    assert "kl_loss_coef" not in mapping["actor"]
    mapping, fates = _to_rlkit(_trinity(**{"algorithm.kl_loss_fn_args": {"kl_coef": 0}}), "t")
    assert mapping["actor"]["kl_loss_coef"] == 0 and "kl_loss_type" not in mapping["actor"]
    assert "algorithm.kl_loss_fn" not in {f.key for f in fates}


def test_a_file_naming_no_algorithm_type_is_ppo(tmp_path: Path) -> None:
    """AlgorithmConfig.algorithm_type defaults to ppo: the migrated job is ppo, with ppo's KL loss and critic (the
    migration refused the file: rlkit sets no type it is not told)."""
    config, fates = migrated_config(tmp_path, _trinity(**{"algorithm.algorithm_type": None,
                                                          "algorithm.advantage_fn_args": None,
                                                          "model.critic_model_path": "/tmp/critic"}))
    assert (config.type, config.actor.kl_loss_type, config.actor.kl_loss_coef) == ("ppo", "k2", 0.001)
    assert config.critic.path == "/tmp/critic"  # ppo's critic, as the file's algorithm_type ppo would have it
    assert fates["algorithm.algorithm_type"] == ("moved to type as ppo, Trinity-RFT's default algorithm_type "
                                                 "(AlgorithmConfig)")


def test_a_null_entropy_loss_fn_is_the_default_function_reading_entropy_coef() -> None:
    """entropy_loss_fn null is unset (the algorithm type's default function), so its entropy_coef is the bonus."""
    data = _trinity(**{"algorithm.entropy_loss_fn_args": {"entropy_coef": 0.003}})
    data["algorithm"]["entropy_loss_fn"] = None
    mapping, fates = _to_rlkit(data, "t")
    assert mapping["actor"]["entropy_coeff"] == 0.003
    assert {f.key: f.fate for f in fates}["algorithm.entropy_loss_fn_args.entropy_coef"] == \
        "moved to actor.entropy_coeff"
