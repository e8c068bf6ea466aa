"""Submit-time validation refuses reward/advantage/KL/loss settings that have no meaning (issue 17), naming the
field, together with every other problem; AReaL's own refusals (NormConfig and RejectionSamplingConfig
`__post_init__` in areal/api/cli_args.py at 4aef98d8) are among them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlkit.config.load import load_config
from rlkit.errors import ConfigError
from tests.conftest import raise_problems


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["actor.adv_norm.mean_level=global"], "actor.adv_norm.mean_level 'global' is not one of"),
        (["actor.reward_norm.std_level=token"], "actor.reward_norm.std_level 'token' is not one of"),
        (["actor.reward_norm.group_size=3", "actor.reward_norm.mean_level=group"],
         "actor.reward_norm.group_size 3 does not divide"),
        (["actor.reward_norm.mean_level=null", "actor.reward_norm.mean_leave1out=true"],
         "actor.reward_norm.mean_leave1out without a mean_level"),
        (["actor.adv_norm.eps=0"], "actor.adv_norm.eps must be positive"),
        (["actor.reward_norm.mean_level=group", "actor.reward_norm.group_size=1"],
         "actor.reward_norm.mean_level group with groups of 1"),
        (["actor.kl_loss_type=k4"], "actor.kl_loss_type 'k4' is not one of"),
        (["actor.kl_estimator=abs"], "actor.kl_estimator 'abs' is not one of"),
        (["actor.kl_loss_coef=-1"], "actor.kl_loss_coef must be at least 0"),
        (["actor.entropy_coeff=-0.01"], "actor.entropy_coeff must be at least 0"),
        (["actor.ppo_epochs=0"], "actor.ppo_epochs must be at least 1"),
        (["critic.ppo_epochs=0"], "critic.ppo_epochs must be at least 1"),
        (["actor.log_ratio_clamp=0"], "actor.log_ratio_clamp must be positive or null"),
        (["actor.gae_lambda=1.5"], "actor.gae_lambda must be between 0 and 1"),
        (["actor.behav_imp_weight_cap=5"], "but actor.use_decoupled_loss is false"),
        (["actor.use_decoupled_loss=true", "actor.behav_imp_weight_cap=0.5"], "behav_imp_weight_cap must be > 1"),
        (["actor.use_decoupled_loss=true", "actor.behav_imp_weight_cap=5", "actor.rejection_sampling.upper=5"],
         "are both set"),
        (["actor.use_decoupled_loss=true", "actor.recompute_logprob=false"], "needs actor.recompute_logprob=true"),
        (["actor.use_decoupled_loss=true", "actor.rejection_sampling.upper=1"], "upper must be > 1 for metric ratio"),
        (["actor.use_decoupled_loss=true", "actor.rejection_sampling.lower=6"], "is above"),
        (["actor.use_decoupled_loss=true", "actor.rejection_sampling.action=clamp",
          "actor.rejection_sampling.metric=kl_k3"], "action clamp bounds the importance weight itself"),
        (["actor.use_decoupled_loss=true", "actor.rejection_sampling.level=batch"],
         "actor.rejection_sampling.level 'batch' is not one of"),
        (["actor.use_sapo_loss=true", "actor.use_decoupled_loss=true"],
         "actor.use_sapo_loss is not compatible with actor.use_decoupled_loss=true"),
        (["actor.use_sapo_loss=true", "actor.c_clip=3"], "actor.c_clip is a bound of PPO's clip"),
        (["actor.use_sapo_loss=true", "actor.eps_clip_higher=0.28"], "actor.eps_clip_higher is a bound of PPO's clip"),
        (["actor.use_sapo_loss=true", "actor.sapo_tau_pos=0"], "actor.sapo_tau_pos must be positive"),
        (["actor.sapo_tau_neg=-1"], "actor.sapo_tau_neg must be positive"),
        (["actor.m2_threshold=0.04"], "actor.m2_threshold masks tokens by the behaviour weight"),
        (["actor.use_decoupled_loss=true", "actor.m2_threshold=0"], "actor.m2_threshold must be positive or null"),
        (["actor.loss_agg_mode=seq-mean"], "actor.loss_agg_mode 'seq-mean' is not one of: token-mean, "
         "seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm"),
        (["actor.loss_scale_factor=1024"], "actor.loss_scale_factor is set, but actor.loss_agg_mode is token-mean"),
        (["actor.loss_agg_mode=seq-mean-token-sum-norm", "actor.loss_scale_factor=0"],
         "actor.loss_scale_factor must be at least 1"),
        (["actor.loss_agg_mode=seq-mean-token-mean", "expert_dataset.path=/nonexistent/expert.jsonl"],
         "actor.loss_agg_mode seq-mean-token-mean with expert_dataset.path (the SFT+RL mix)"),
        (["actor.prox_logp_method=loglinear"], "actor.prox_logp_method loglinear says how the decoupled loss"),
        (["actor.prox_logp_method=metrics"], "actor.prox_logp_method metrics says how the decoupled loss"),
        (["actor.use_decoupled_loss=true", "actor.prox_logp_method=linear"],
         "actor.prox_logp_method 'linear' is not one of: recompute, loglinear, metrics"),
        (["actor.use_decoupled_loss=true", "actor.prox_logp_method=loglinear", "rollout.max_head_offpolicyness=1"],
         "the interpolation weight is 0 everywhere"),
        (["actor.use_decoupled_loss=true", "actor.prox_logp_method=metrics", "actor.recompute_logprob=false"],
         "needs actor.recompute_logprob=true"),
        (["actor.kl_ctl_adaptive.target_kl=0.05"], "actor.kl_ctl_adaptive is set, but actor.kl_ctl (its starting "
         "coefficient) is 0"),
        (["actor.kl_ctl=0.1", "actor.kl_ctl_adaptive.horizon=3"], "actor.kl_ctl_adaptive.horizon 3 is too short for "
         "16 sequences a step"),  # 4 prompts x 4 samples: 1 - 0.2 x 16 / 3 < 0
        (["actor.kl_ctl=0.1", "actor.kl_ctl_adaptive.horizon=0"], "actor.kl_ctl_adaptive.horizon must be at least 1"),
        (["actor.kl_ctl=0.1", "actor.kl_ctl_adaptive.target_kl=0"],
         "actor.kl_ctl_adaptive.target_kl must be positive"),
    ],
)
def test_meaningless_settings_are_refused(grpo_yaml: Path, overrides: list[str], says: str) -> None:
    config = load_config(grpo_yaml, [*overrides, "actor.optimizer.lr=-1"])
    with pytest.raises(ConfigError) as info:
        raise_problems(config)
    assert says in info.value.message
    assert "actor.optimizer.lr must be positive" in info.value.message  # collected with the other problems


@pytest.mark.parametrize("overrides", [["actor.loss_agg_mode=seq-mean-token-mean"],
                                       ["actor.loss_agg_mode=seq-mean-token-sum", "actor.kl_loss_coef=0.01"],
                                       ["actor.loss_agg_mode=seq-mean-token-sum-norm"],
                                       ["actor.loss_agg_mode=seq-mean-token-sum-norm", "actor.loss_scale_factor=4096"]])
def test_every_loss_agg_mode_is_accepted(grpo_yaml: Path, overrides: list[str]) -> None:
    raise_problems(load_config(grpo_yaml, overrides))


def test_the_adaptive_kl_controller_is_accepted_with_a_coefficient_to_adapt(grpo_yaml: Path) -> None:
    """The smallest horizon of 16 sequences a step: 1 - 0.2 x 16 / 4 = 0.2 > 0; an empty block is verl's defaults."""
    config = load_config(grpo_yaml, ["actor.kl_ctl=0.1", "actor.kl_ctl_adaptive.horizon=4"])
    raise_problems(config)
    assert config.actor.kl_ctl_adaptive is not None and config.actor.kl_ctl_adaptive.target_kl == 0.1
    config = load_config(grpo_yaml, ["type=ppo", "actor.kl_ctl=0.1", "actor.kl_ctl_adaptive={}"])
    assert config.actor.kl_ctl_adaptive is not None and config.actor.kl_ctl_adaptive.horizon == 10000


def test_areal_recipe_knobs_are_accepted(grpo_yaml: Path) -> None:
    raise_problems(load_config(grpo_yaml, [
        "actor.reward_scaling=10", "actor.reward_bias=-0.5", "actor.reward_norm.mean_level=group",
        "actor.reward_norm.std_level=group", "actor.reward_norm.group_size=4", "actor.adv_norm.mean_level=batch",
        "actor.use_decoupled_loss=true", "actor.rejection_sampling.metric=ratio",
        "actor.rejection_sampling.upper=5.0", "actor.kl_ctl=0.1", "actor.kl_loss_coef=0.01",
        "actor.entropy_coeff=0.001", "actor.ppo_epochs=2"]))


def test_sapo_and_m2po_are_accepted_each_with_what_it_needs(grpo_yaml: Path) -> None:
    raise_problems(load_config(grpo_yaml, ["actor.use_sapo_loss=true", "actor.sapo_tau_pos=2",
                                           "actor.importance_sampling_level=sequence"]))
    raise_problems(load_config(grpo_yaml, ["actor.use_decoupled_loss=true", "actor.m2_threshold=0.04",
                                           "actor.rejection_sampling.upper=5.0"]))
    # AReaL's examples/math/gsm8k_m2po.yaml: eps_clip 0 (the ratio clipped to 1) with one minibatch
    raise_problems(load_config(grpo_yaml, ["actor.use_decoupled_loss=true", "actor.m2_threshold=0.04",
                                           "actor.eps_clip=0.0", "actor.ppo_n_minibatches=1"]))


def test_the_other_policy_losses_are_accepted_with_their_bounds(grpo_yaml: Path) -> None:
    """verl's cispo example's bounds (no lower bound: 1 - 10 < 0), GMPO's log-space range with a mean over
    sequences, GPG with the decoupled loss's weight."""
    for overrides in (["actor.policy_loss=cispo", "actor.eps_clip=10", "actor.eps_clip_higher=0.2"],
                      ["actor.policy_loss=gmpo", "actor.eps_clip=0.4", "actor.loss_agg_mode=seq-mean-token-mean"],
                      ["actor.policy_loss=gpg", "actor.use_decoupled_loss=true", "actor.m2_threshold=0.04"]):
        config = load_config(grpo_yaml, overrides)
        raise_problems(config)
        assert config.actor.policy_loss == overrides[0].split("=")[1]


@pytest.mark.parametrize(("overrides", "says"), [
    (["actor.policy_loss=geo_mean"], "actor.policy_loss 'geo_mean' is not one of: ppo, cispo, gmpo, gpg"),
    (["actor.policy_loss=gmpo"], "actor.policy_loss gmpo with actor.loss_agg_mode token-mean: GMPO's loss is one "
                                 "value per sequence"),
    (["actor.policy_loss=cispo", "actor.c_clip=3"], "actor.c_clip is set, but actor.policy_loss is not ppo"),
    (["actor.policy_loss=cispo", "actor.use_sapo_loss=true"],
     "actor.use_sapo_loss is set, but actor.policy_loss is not ppo"),
    (["actor.policy_loss=gmpo", "actor.loss_agg_mode=seq-mean-token-mean", "actor.importance_sampling_level=sequence"],
     "actor.importance_sampling_level is set, but actor.policy_loss is not ppo"),
    (["actor.policy_loss=gpg", "actor.eps_clip=0.3"], "actor.eps_clip is set, but actor.policy_loss is gpg"),
    (["actor.policy_loss=gpg", "actor.eps_clip_higher=0.28"], "actor.eps_clip_higher is set, but actor.policy_loss "
                                                              "is gpg (-A log pi: no ratio, no clip)"),
    (["type=opmd", "actor.policy_loss=cispo"], "actor.policy_loss is set, but job type opmd has no PPO clipped loss"),
])
def test_a_policy_loss_refuses_the_knobs_it_does_not_read(grpo_yaml: Path, overrides: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        raise_problems(load_config(grpo_yaml, overrides))
    assert says in info.value.message


def test_opmd_refuses_the_ppo_loss_variants(grpo_yaml: Path) -> None:
    config = load_config(grpo_yaml, ["type=opmd", "actor.use_sapo_loss=true", "actor.use_decoupled_loss=true",
                                     "actor.m2_threshold=0.04"])
    with pytest.raises(ConfigError) as info:
        raise_problems(config)
    for name in ("use_sapo_loss", "m2_threshold"):  # OPMD's own loss reads none of PPO's clip knobs
        assert f"actor.{name} is set, but job type opmd has no PPO clipped loss (that of grpo, ppo, distill)" in \
            info.value.message


@pytest.mark.parametrize("method", ["loglinear", "metrics"])
def test_areal_prox_logp_methods_are_accepted(grpo_yaml: Path, method: str) -> None:
    """As AReaL's prox_approx example: loglinear needs no recompute_logprob (nothing is recomputed)."""
    config = load_config(grpo_yaml, ["actor.use_decoupled_loss=true", f"actor.prox_logp_method={method}",
                                     "rollout.max_head_offpolicyness=2",
                                     f"actor.recompute_logprob={str(method == 'metrics').lower()}"])
    raise_problems(config)
    assert config.actor.prox_logp_method == method


def test_the_policy_knobs_of_a_job_without_a_ppo_actor_are_refused(generate_yaml: Path) -> None:
    """generate trains nothing: an entropy bonus or passes over a batch would be ignored."""
    config = load_config(generate_yaml, ["actor.entropy_coeff=0.01", "actor.ppo_epochs=2"])
    with pytest.raises(ConfigError) as info:
        raise_problems(config)
    for field in ("actor.entropy_coeff", "actor.ppo_epochs"):
        assert f"{field} is set, but job type generate has no PPO actor update (that of grpo, " in info.value.message
        assert f"remove {field}" in str(info.value)
    raise_problems(load_config(generate_yaml, ["actor.entropy_coeff=0", "actor.ppo_epochs=1"]))  # the defaults


def test_the_adaptive_kl_controller_of_a_job_without_a_kl_reward_penalty_is_refused(generate_yaml: Path) -> None:
    config = load_config(generate_yaml, ["actor.kl_ctl_adaptive.target_kl=0.05"])
    with pytest.raises(ConfigError) as info:
        raise_problems(config)
    assert "actor.kl_ctl_adaptive is set, but job type generate has no rewards and advantages of rollouts (that of " \
           "grpo, " in info.value.message and "remove actor.kl_ctl_adaptive" in str(info.value)


def test_the_policy_loss_knobs_of_a_job_without_a_ppo_actor_are_refused(generate_yaml: Path) -> None:
    """The policy loss's own knobs (its average, SAPO, M2PO, the proximal policy's source) are the PPO actor's too:
    generate (like sft, rw, dpo) would ignore every one of them, each named with its fix."""
    update = {"actor.loss_agg_mode": "seq-mean-token-sum-norm", "actor.loss_scale_factor": "512",
              "actor.prox_logp_method": "loglinear"}
    clip = {"actor.use_sapo_loss": "true", "actor.sapo_tau_pos": "2", "actor.sapo_tau_neg": "2",
            "actor.m2_threshold": "0.04"}
    config = load_config(generate_yaml, [f"{field}={value}" for field, value in {**update, **clip}.items()])
    with pytest.raises(ConfigError) as info:
        raise_problems(config)
    for field in update:
        assert f"{field} is set, but job type generate has no PPO actor update (that of grpo, " in info.value.message
        assert f"remove {field}" in str(info.value)
    for field in clip:
        assert f"{field} is set, but job type generate has no PPO clipped loss (that of grpo, ppo, distill)" in \
            info.value.message
        assert f"remove {field}" in str(info.value)


def test_the_group_estimators_fields_are_refused_where_they_would_be_ignored(grpo_yaml: Path) -> None:
    """pass@k with groups of one has no second best; OPMD's own advantage replaces GRPO's sequence advantages, so
    pass@k and GPG's correction would not act there."""
    with pytest.raises(ConfigError) as info:
        raise_problems(load_config(grpo_yaml, ["actor.passk_advantage=true", "gconfig.n_samples=1",
                                               "actor.group_size=1", "actor.reward_norm=null"]))
    assert "actor.passk_advantage with groups of 1 sample" in info.value.message
    with pytest.raises(ConfigError) as info:
        raise_problems(load_config(grpo_yaml, ["type=opmd", "actor.reward_norm=null", "actor.passk_advantage=true",
                                               "actor.gpg_scale=true"]))
    for name in ("passk_advantage", "gpg_scale"):
        assert f"actor.{name} is set, but OPMD's advantage is the reward minus its group baseline" in \
            info.value.message
    raise_problems(load_config(grpo_yaml, ["actor.passk_advantage=true", "actor.gpg_scale=true"]))


def test_the_kl_penalty_level(grpo_yaml: Path) -> None:
    """token or sequence; sequence needs a KL reward penalty (kl_ctl > 0: else ignored, rlkit.checks.
    conditional_knobs), and neither ppo (its GAE reads a reward per token) nor opmd (its own advantage) sums it."""
    raise_problems(load_config(grpo_yaml, ["actor.kl_ctl=0.01", "actor.kl_penalty_level=sequence"]))
    with pytest.raises(ConfigError, match=re.escape("actor.kl_penalty_level 'seq' is not one of: token, sequence")):
        raise_problems(load_config(grpo_yaml, ["actor.kl_ctl=0.01", "actor.kl_penalty_level=seq"]))
    with pytest.raises(ConfigError, match=re.escape("actor.kl_penalty_level is set, but actor.kl_ctl is 0")):
        raise_problems(load_config(grpo_yaml, ["actor.kl_penalty_level=sequence"]))
    with pytest.raises(ConfigError, match=re.escape("actor.kl_penalty_level is set, but OPMD's advantage")):
        raise_problems(load_config(grpo_yaml, ["type=opmd", "actor.reward_norm=null", "actor.kl_ctl=0.01",
                                               "actor.kl_penalty_level=sequence"]))
    with pytest.raises(ConfigError, match=re.escape("actor.kl_penalty_level sequence sums the KL penalty into each "
                                                    "sequence's reward, but ppo's GAE")):
        raise_problems(load_config(grpo_yaml, ["type=ppo", "actor.kl_ctl=0.01", "actor.kl_penalty_level=sequence"]))
