"""`rlkit migrate` of the defaults Trinity-RFT's algorithm types carry (trinity/algorithm/algorithm.py default_config,
filled by config_validator's AlgorithmConfigValidator with set_if_none): a file naming no kl_loss_fn trains with a k2
KL loss at kl_coef 0.001 (verl_config's use_kl_loss is kl_loss_fn != "none"), one naming no algorithm_type is ppo, and
grpo's advantages are the group-normalised rewards. The migration left these out: the migrated run had no KL loss, the
file was refused ("'type' is not set"), or rlkit trained on the raw rewards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlkit.errors import ConfigError
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


@pytest.mark.parametrize("algorithm", ["grpo", "cispo", "gspo", "mix"])
def test_grpo_s_advantages_are_the_group_normalised_rewards(tmp_path: Path, algorithm: str) -> None:
    """advantage_fn grpo (these types' default) is Trinity-RFT's GRPOGroupedAdvantage: (r - group mean) / (group std
    + 1e-6); the migrated file once set no reward_norm, so rlkit trained on the raw rewards."""
    changes: dict[str, Any] = {"algorithm.algorithm_type": algorithm, "algorithm.advantage_fn_args": None,
                               **(EXPERT if algorithm == "mix" else {})}
    config, fates = migrated_config(tmp_path, _trinity(**changes))
    norm = config.actor.reward_norm
    assert (norm.mean_level, norm.std_level, norm.std_unbiased, norm.eps) == ("group", "group", True, 1e-6)
    assert fates["algorithm.advantage_fn"].endswith(f"Trinity-RFT's default for algorithm_type {algorithm}")


def test_the_group_normalisation_written_computes_trinity_s_grpo_advantage(tmp_path: Path) -> None:
    """The reward_norm the migration writes, through rlkit's own normalisation, gives GRPOGroupedAdvantage's
    numbers: each group's mean taken off, divided by its Bessel-corrected std + epsilon."""
    import torch

    from rlkit.trainer.rl_math.advantage_batch import apply_norm

    config, _ = migrated_config(tmp_path, _trinity(**{"algorithm.algorithm_type": "grpo",
                                                      "algorithm.advantage_fn": "grpo",
                                                      "algorithm.advantage_fn_args": {"epsilon": 0.01},
                                                      "algorithm.repeat_times": 4}))
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 2.0])
    groups = rewards.view(2, 4)
    trinity = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 0.01)).view(-1)
    assert torch.allclose(apply_norm(rewards, config.actor.reward_norm, config.actor), trinity, atol=1e-6)


@pytest.mark.parametrize("changes, says", [
    ({"algorithm.algorithm_type": "grpo", "algorithm.advantage_fn": "rloo"},
     r"advantage_fn 'rloo' with algorithm_type grpo .* computes algorithm_type grpo's advantages \(grpo\)"),
    ({"algorithm.advantage_fn": "grpo"}, r"advantage_fn 'grpo' with algorithm_type opmd"),
    ({"algorithm.algorithm_type": "grpo", "algorithm.advantage_fn_args": {"std_cal_level": "batch"}},
     r"std_cal_level 'batch' .* around the batch's mean"),
    ({"algorithm.algorithm_type": "grpo", "algorithm.advantage_fn_args": {"rank_penalty": 0.1}},
     r"rank_penalty 0.1 .* no reward penalty by the rank"),
    ({"algorithm.algorithm_type": "grpo", "algorithm.advantage_fn_args": {"epsilon": "tiny"}},
     r"epsilon 'tiny' .* not a number >= 0"),
])
def test_an_advantage_function_rlkit_does_not_compute_is_refused(changes: dict[str, Any], says: str) -> None:
    """advantage_fn was left out whatever it named: a grpo file asking for RLOO's advantages trained GRPO's."""
    with pytest.raises(ConfigError, match=says):
        _to_rlkit(_trinity(**changes), "t")


@pytest.mark.parametrize("algorithm", ["ppo", "opmd"])
def test_ppo_and_opmd_keep_their_own_advantages(algorithm: str) -> None:
    """ppo's GAE and opmd's baseline are their job types' own: no reward_norm (rlkit's opmd refuses one)."""
    mapping, fates = _to_rlkit(_trinity(**{"algorithm.algorithm_type": algorithm,
                                           "algorithm.advantage_fn": algorithm}), "t")
    assert "reward_norm" not in mapping["actor"]
    assert {f.key: f.fate for f in fates}["algorithm.advantage_fn"].startswith(f"left out ({algorithm}: ")


def test_grpo_with_groups_of_one_trains_on_the_rewards(tmp_path: Path) -> None:
    """repeat_times 1 (AlgorithmConfig's default): Trinity-RFT's group of one has mean 0 and std 1, the advantage is
    the reward; rlkit's group normalisation would zero it (and refuses it), so no reward_norm is written."""
    config, fates = migrated_config(tmp_path, _trinity(**{"algorithm.algorithm_type": "grpo",
                                                          "algorithm.advantage_fn_args": None,
                                                          "algorithm.repeat_times": None}))
    assert (config.type, config.actor.reward_norm, config.gconfig.n_samples) == ("grpo", None, 1)
    assert fates["algorithm.advantage_fn"].startswith("left out (groups of one (repeat_times 1)")


def test_ppo_s_gae_arguments_move(tmp_path: Path) -> None:
    """advantage_fn_args gamma and lam (PPOAdvantageFn's GAE) were left out ("rlkit has no such key")."""
    config, fates = migrated_config(tmp_path, _trinity(**{"algorithm.algorithm_type": "ppo",
                                                          "algorithm.advantage_fn_args": {"gamma": 0.9, "lam": 0.95}}))
    assert (config.actor.discount, config.actor.gae_lambda) == (0.9, 0.95)
    assert fates["algorithm.advantage_fn_args.lam"] == "moved to actor.gae_lambda"
    with pytest.raises(ConfigError, match=r"advantage_fn_args.gamma 2 .* not a number in \[0, 1\]"):
        _to_rlkit(_trinity(**{"algorithm.algorithm_type": "ppo", "algorithm.advantage_fn_args": {"gamma": 2}}), "t")
