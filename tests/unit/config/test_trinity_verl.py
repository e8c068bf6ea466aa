"""`rlkit migrate` of Trinity-RFT's embedded verl trainer config (`trainer.trainer_config`, rlkit.config.trinity_verl):
every key there said "left out (rlkit has no such key)", so a PPO critic's learning rate or the actor's grad_clip were
dropped, and verl's clip_ratio_high looked like DAPO's clip-higher carried. Each key is now judged by what Trinity-RFT's
code does with it: overwritten from its own sections, not read by its trainer, read as verl does (moved by verl's key
map), infrastructure, or refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlkit.errors import ConfigError
from tests.conftest import run_rlkit
from tests.unit.config.test_trinity_migrate import SITE, _to_rlkit, _trinity, _write, migrated_config
from tests.unit.config.test_trinity_offline import _offline

VERL = "trainer.trainer_config"
ACTOR = f"{VERL}.actor_rollout_ref.actor"
GRPO = {"algorithm.algorithm_type": "grpo", "algorithm.advantage_fn_args": None}
PPO = {"algorithm.algorithm_type": "ppo", "algorithm.advantage_fn_args": None}


def _migrated(tmp_path: Path, data: dict[str, Any] | None = None, **changes: Any) -> tuple[Any, dict[str, str]]:
    """The migrated file (`data`, or the test file with `changes`) as rlkit loads it (render's checks run), and each
    Trinity-RFT key's fate."""
    return migrated_config(tmp_path, data or _trinity(**changes))


def test_keys_trinity_overwrites_or_does_not_read_are_left_out_naming_its_own(tmp_path: Path) -> None:
    """Trinity-RFT's actor takes its loss from the algorithm section and its optimizer from algorithm.optimizer: verl's
    clip_ratio_high, entropy_coeff and optim.lr do not reach the run, and one minibatch a step is what it trains."""
    config, fates = _migrated(tmp_path, **GRPO, **{
        f"{ACTOR}.clip_ratio_high": 0.28, f"{ACTOR}.entropy_coeff": 0.5, f"{ACTOR}.optim.lr": 5e-5,
        f"{ACTOR}.ppo_mini_batch_size": 4, f"{ACTOR}.ppo_micro_batch_size_per_gpu": 2,
        f"{VERL}.actor_rollout_ref.rollout.n": 3, f"{VERL}.algorithm.gamma": 0.5})
    actor = config.actor
    assert (actor.eps_clip_higher, actor.entropy_coeff, actor.optimizer.lr) == (None, 0.0, 1e-6)
    assert (actor.ppo_n_minibatches, config.gconfig.n_samples) == (1, 8)
    assert fates[f"{ACTOR}.clip_ratio_high"] == ("left out (not read: Trinity-RFT's trainer takes it from "
                                                 "algorithm.policy_loss_fn_args.clip_range_high)")
    assert fates[f"{ACTOR}.optim.lr"] == "left out (Trinity-RFT overwrites it from algorithm.optimizer.lr)"
    assert "one minibatch a step" in fates[f"{ACTOR}.ppo_mini_batch_size"]
    assert fates[f"{ACTOR}.ppo_micro_batch_size_per_gpu"].startswith("left out (rlkit sets the number of micro")
    assert "algorithm.advantage_fn_args.gamma" in fates[f"{VERL}.algorithm.gamma"]
    # a file without the key still trains one minibatch a step, said in the header
    config, fates = _migrated(tmp_path, **GRPO)
    assert config.actor.ppo_n_minibatches == 1 and "moved to actor.ppo_n_minibatches as 1" in \
        fates[f"{ACTOR}.ppo_mini_batch_size"]


def test_keys_trinity_reads_move_and_win_over_its_trainer_section(tmp_path: Path) -> None:
    """synchronize_config fills the actor's grad_clip, token budget and ulysses size from the trainer section only
    when trainer_config leaves them unset: set there, they win; ppo_epochs and the rollout correction's bypass_mode
    are read as verl reads them."""
    config, fates = _migrated(tmp_path, **GRPO, **{
        f"{ACTOR}.grad_clip": 0.5, f"{ACTOR}.ppo_max_token_len_per_gpu": 4096, f"{ACTOR}.ppo_epochs": 2,
        "trainer.grad_clip": 1.0, "trainer.max_token_len_per_gpu": 8192})
    actor = config.actor
    assert (actor.optimizer.gradient_clipping, actor.mb_spec.max_tokens_per_mb, actor.ppo_epochs) == (0.5, 4096, 2)
    assert fates["trainer.grad_clip"].startswith(f"left out ({ACTOR}.grad_clip is set and wins")
    assert fates[f"{ACTOR}.grad_clip"] == "moved to actor.optimizer.gradient_clipping"
    # null: Trinity-RFT's trainer section fills it
    data = _trinity(**GRPO, **{"trainer.grad_clip": 0.7})
    data["trainer"]["trainer_config"] = {"actor_rollout_ref": {"actor": {"grad_clip": None}}}
    config, fates = _migrated(tmp_path, data)
    assert config.actor.optimizer.gradient_clipping == 0.7
    assert fates[f"{ACTOR}.grad_clip"] == "left out (null: Trinity-RFT fills it from trainer.grad_clip)"
    # verl's rollout correction, which Trinity-RFT's trainer reads: bypass mode takes the servers' log-probs
    config, _ = _migrated(tmp_path, **GRPO, **{f"{VERL}.algorithm.rollout_correction.bypass_mode": True})
    assert config.actor.recompute_logprob is False
    # algorithm.optimizer.clip_grad that says otherwise than the winning grad_clip is refused
    with pytest.raises(ConfigError) as info:
        _to_rlkit(_trinity(**GRPO, **{f"{ACTOR}.grad_clip": 0.5, "algorithm.optimizer.clip_grad": 2.0}), "t")
    assert f"algorithm.optimizer.clip_grad 2.0 and {ACTOR}.grad_clip 0.5 (t) disagree" in str(info.value)


def test_trinity_s_default_bypass_mode_is_written_as_the_servers_log_probs(tmp_path: Path) -> None:
    """Trinity-RFT's verl config defaults algorithm.rollout_correction.bypass_mode to true (its RolloutCorrection):
    train_step then takes the experiences' log-probs as the old policy, whatever the algorithm. A file relying on it
    migrated into rlkit's recompute (actor.recompute_logprob true), another run under staleness > 0; it is written
    as false, and said. An explicit false keeps the recompute; sft's file, without rollouts, gets nothing."""
    aux = "buffer.trainer_input.auxiliary_buffers.sft_dataset"
    key = f"{VERL}.algorithm.rollout_correction.bypass_mode"
    said = "moved to actor.recompute_logprob as false, Trinity-RFT's default bypass_mode true: the servers' log-probs"
    config, fates = _migrated(tmp_path, **GRPO)  # the whole path: written, loaded, render's checks
    assert config.actor.recompute_logprob is False and fates[key].startswith(said), fates[key]
    for algorithm in (PPO, {}, {**GRPO, "algorithm.algorithm_type": "mix", aux: {"path": "/tmp/sft.jsonl"}}):
        mapping, listed = _to_rlkit(_trinity(**algorithm), "t")  # {}: the test file's opmd
        assert mapping["actor"]["recompute_logprob"] is False
        assert {f.key: f.fate for f in listed}[key].startswith(said)
    config, fates = _migrated(tmp_path, **GRPO, **{key: False})
    assert config.actor.recompute_logprob is True
    assert fates[key] == "moved to actor.recompute_logprob true (the trainer recomputes the old policy's log-probs)"
    mapping, listed = _to_rlkit(_offline("sft"), "t")
    assert "recompute_logprob" not in mapping.get("actor", {}) and key not in {f.key for f in listed}


def test_the_servers_log_probs_with_what_rlkit_refuses_beside_them(tmp_path: Path) -> None:
    """Through the CLI: rlkit's decoupled loss needs the recomputed log-probs as its proximal policy, so on the
    migrated default (the servers' log-probs) it exits 2 naming the fix; with bypass_mode false it migrates. A
    bypass_mode that is not true or false is refused naming both meanings."""
    key = f"{VERL}.algorithm.rollout_correction.bypass_mode"
    refused = run_rlkit("migrate", str(_write(tmp_path, _trinity(**GRPO))), *SITE, "actor.use_decoupled_loss=true")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "actor.use_decoupled_loss needs actor.recompute_logprob=true" in refused.stderr, refused.stderr
    done = run_rlkit("migrate", str(_write(tmp_path, _trinity(**GRPO, **{key: False}))), *SITE,
                     "actor.use_decoupled_loss=true")
    assert done.returncode == 0, done.stderr
    assert "\n  recompute_logprob: true\n" in done.stdout
    with pytest.raises(ConfigError) as info:
        _to_rlkit(_trinity(**GRPO, **{key: "yes"}), "t")
    assert f"{key} 'yes' (t): not true or false" in str(info.value)


def test_the_ppo_critic_is_read_with_trinity_s_defaults(tmp_path: Path) -> None:
    """ppo's critic: its optimizer and value clip as written (verl's names, verl's key map), Trinity-RFT's defaults
    where unset (lr 1e-6, one epoch, one minibatch a step, trainer.grad_clip; its cliprange_value 0.0 is no range
    rlkit takes: said); a run without a critic leaves the section out."""
    critic = f"{VERL}.critic"
    config, fates = _migrated(tmp_path, **PPO, **{f"{critic}.optim.lr": 5e-6, f"{critic}.optim.betas": [0.9, 0.95],
                                                  f"{critic}.cliprange_value": 0.2, f"{critic}.ppo_epochs": 2})
    c = config.critic
    assert (c.optimizer.lr, c.optimizer.beta2, c.eps_clip, c.ppo_epochs, c.ppo_n_minibatches) == (5e-6, 0.95, 0.2, 2, 1)
    assert fates[f"{critic}.optim.lr"] == "moved to critic.optimizer.lr"
    config, fates = _migrated(tmp_path, **PPO, **{"trainer.grad_clip": 0.8})
    c = config.critic
    assert (c.optimizer.lr, c.optimizer.beta2, c.eps_clip, c.ppo_epochs) == (1e-6, 0.999, 0.5, 1)
    assert "Trinity-RFT's default 0.0 is no range" in fates[f"{critic}.cliprange_value"]
    assert c.optimizer.gradient_clipping == 0.8
    assert fates[f"{critic}.optim.lr"] == "moved to critic.optimizer.lr as 1e-06, Trinity-RFT's default"
    _, fates = _migrated(tmp_path, **GRPO, **{f"{critic}.optim.lr": 5e-6})
    assert fates[f"{critic}.optim.lr"].startswith("left out (only algorithm_type ppo trains a critic")


def test_unknown_learning_keys_and_unbuilt_meanings_are_refused(tmp_path: Path) -> None:
    """Through the CLI: an unknown key under a learning section (the actor's optimizer), a LoRA adapter only the
    trainer knows of, and verl's rollout importance sampling exit 2 naming each; an unknown key elsewhere is named in
    the header and the file migrates."""
    refused = run_rlkit("migrate", str(_write(tmp_path, _trinity(**GRPO, **{
        f"{ACTOR}.optim.lr_sheduler": "cosine", f"{VERL}.actor_rollout_ref.model.lora_rank": 8,
        f"{VERL}.algorithm.rollout_correction.rollout_is": "token"}))), *SITE)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    for says in (f"{ACTOR}.optim.lr_sheduler 'cosine'", "a LoRA adapter only the trainer knows of",
                 f"{VERL}.algorithm.rollout_correction.rollout_is 'token'"):
        assert says in refused.stderr, refused.stderr
    done = run_rlkit("migrate", str(_write(tmp_path, _trinity(**GRPO, **{f"{VERL}.trainer.some_flag": True}))),
                     *SITE)
    assert done.returncode == 0, done.stderr
    assert f"#   {VERL}.trainer.some_flag: true  -> left out (verl's trainer bookkeeping" in done.stdout
