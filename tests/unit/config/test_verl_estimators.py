"""`rlkit migrate` of verl runs with the estimators session 40 added (grpo_vectorized, rloo_vectorized, grpo_passk, opo,
gpg): each becomes grpo settings, said in the header, that load, and under which rlkit's own advantage code
(prepare_batch, token_advantages) gives verl's advantages, computed here from verl's definitions; what rlkit cannot
reproduce (grpo_vectorized told not to divide by the std, remax, the optimal token baseline) is refused naming why
and the fix. With verl's KL reward penalty (use_kl_in_reward) every estimator that sums a sequence's token rewards
migrates with the penalty summed into the sequence's reward (actor.kl_penalty_level: sequence) and gives verl's
advantages of the penalised sums."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from rlkit.config.schema.actor import ActorConfig, NormConfig
from rlkit.config.verl.rules import verl_to_rlkit
from rlkit.errors import ConfigError
from rlkit.jobs import REGISTRY
from rlkit.launch.submit import prepare
from rlkit.trainer.rl_math.advantage_batch import prepare_batch, token_advantages
from rlkit.types import Sample
from tests.conftest import run_rlkit
from tests.unit.config.test_verl_migrate import GRPO_SCRIPT, _migrated, _said
from tests.unit.trainer.test_group_estimators import gpg_reference, opo_reference, passk_reference

GROUP = 5
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 0.25, 1.0, 1.0, 0.0, 0.75]  # a tie at the top of the second group
LENGTHS = [3, 5, 2, 4, 6, 1, 3, 2, 5, 4]
VERL_EPS = 1e-6


def _by_group(values: list[float], size: int = GROUP) -> list[list[float]]:
    return [values[i:i + size] for i in range(0, len(values), size)]


def grpo_vectorized_reference(rewards: list[float], size: int = GROUP) -> list[float]:
    """verl's grpo_vectorized: the group mean, and the std from the one-pass variance floored at eps."""
    out = []
    for g in _by_group(rewards, size):
        mean = sum(g) / len(g)
        var = (sum(r * r for r in g) - sum(g) ** 2 / len(g)) / (len(g) - 1)
        out += [(r - mean) / (max(var, VERL_EPS) ** 0.5 + VERL_EPS) for r in g]
    return out


def rloo_vectorized_reference(rewards: list[float]) -> list[float]:
    """verl's rloo_vectorized: (count x reward - the group's sum) / (count - 1)."""
    return [(len(g) * r - sum(g)) / (len(g) - 1) for g in _by_group(rewards) for r in g]


def _actor_of(tmp_path: Path, site: list[str], words: str, *,
              kl_in_reward: bool = False) -> tuple[ActorConfig, dict[str, str], str]:
    """The migrated GRPO_SCRIPT with algorithm.adv_estimator=grpo replaced by `words` (and its
    algorithm.use_kl_in_reward=False by True with `kl_in_reward`): its actor as loaded, its header's fates, its
    text."""
    script = tmp_path / "run.sh"
    text = GRPO_SCRIPT.replace("algorithm.adv_estimator=grpo", words)
    if kl_in_reward:
        assert "algorithm.use_kl_in_reward=False" in text
        text = text.replace("algorithm.use_kl_in_reward=False", "algorithm.use_kl_in_reward=True")
    script.write_text(text)
    text = _migrated(script, site)
    clean = tmp_path / "clean.yaml"
    clean.write_text(text)
    return prepare(clean, [], dry_run=True).config.actor, _said(text), text


def _advantages(actor: ActorConfig) -> list[list[float]]:
    samples = [Sample(prompt_ids=[1, 2], completion_ids=[5] * n, behav_logp=[-0.1] * n, reward=r, version=0,
                      finished=True, group=i // GROUP) for i, (r, n) in enumerate(zip(REWARDS, LENGTHS, strict=True))]
    batch = prepare_batch([samples[:GROUP], samples[GROUP:]], actor, max_new_tokens=8).samples
    token_advantages(batch, None, None, actor)
    return [s.token_advantages or [] for s in batch]


def _flat(per_sequence: list[float]) -> list[list[float]]:
    return [[a] * n for a, n in zip(per_sequence, LENGTHS, strict=True)]


@pytest.mark.parametrize(("words", "says", "reference"), [
    ("algorithm.adv_estimator=grpo_vectorized", "variance floored at 1e-6",
     lambda: _flat(grpo_vectorized_reference(REWARDS))),
    ("algorithm.adv_estimator=rloo_vectorized", "leave-one-out group mean",
     lambda: _flat(rloo_vectorized_reference(REWARDS))),
    ("algorithm.adv_estimator=grpo_passk", "actor.passk_advantage",
     lambda: _flat(passk_reference(REWARDS, GROUP, by_std=True))),
    ("algorithm.adv_estimator=grpo_passk algorithm.norm_adv_by_std_in_grpo=False", "actor.passk_advantage",
     lambda: _flat(passk_reference(REWARDS, GROUP, by_std=False))),
    ("algorithm.adv_estimator=opo algorithm.gamma=0.9", "length-weighted mean reward",
     lambda: opo_reference(REWARDS, LENGTHS, GROUP)),
    ("algorithm.adv_estimator=gpg", "actor.gpg_scale", lambda: _flat(gpg_reference(REWARDS, GROUP))),
])
def test_each_estimator_migrates_to_settings_giving_its_advantages(tmp_path: Path, site: list[str], words: str,
                                                                    says: str, reference: object) -> None:
    actor, said, _ = _actor_of(tmp_path, site, words)
    assert said["algorithm.adv_estimator"].startswith("moved to type as grpo, ") and says in \
        said["algorithm.adv_estimator"], said["algorithm.adv_estimator"]
    assert actor.discount == 1.0 and actor.kl_ctl == 0.0  # opo's gamma 0.9: verl's opo does not read it
    got = _advantages(actor)
    expected = reference()  # type: ignore[operator]
    assert [len(row) for row in got] == LENGTHS
    for row, want in zip(got, expected, strict=True):
        assert row == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_grpo_vectorized_differs_from_grpo_only_in_a_group_spread_under_its_variance_floor() -> None:
    """The header's caveat, measured: rewards 0 and 1e-4 (std ~7.1e-5) are +-5e-5 / (7.1e-5 + 1e-6) = +-0.70 in
    rlkit's grpo settings, +-5e-5 / (1e-3 + 1e-6) = +-0.05 in verl's grpo_vectorized; a group of 0/1 rewards is the
    same in both."""
    actor = ActorConfig(group_size=2, reward_norm=NormConfig(mean_level="group", std_level="group", eps=VERL_EPS))
    samples = [Sample([1], [5], [-0.1], r, 0, True, i // 2) for i, r in enumerate([0.0, 1e-4, 0.0, 1.0])]
    got = [s.advantage for s in prepare_batch([samples[:2], samples[2:]], actor, max_new_tokens=8).samples]
    verl = grpo_vectorized_reference([0.0, 1e-4, 0.0, 1.0], size=2)
    assert got[:2] == pytest.approx([-0.6972, 0.6972], rel=1e-3) and verl[:2] == pytest.approx([-0.05, 0.05], rel=1e-2)
    assert got[2:] == pytest.approx(verl[2:], rel=1e-5)


def test_the_new_fields_load_and_render(tmp_path: Path, site: list[str]) -> None:
    """pass@k and GPG's fields as the migration writes them: the config renders a job script."""
    for words in ("algorithm.adv_estimator=grpo_passk", "algorithm.adv_estimator=gpg"):
        actor, _, _ = _actor_of(tmp_path, site, words)
        assert (actor.passk_advantage, actor.gpg_scale) == (words.endswith("passk"), words.endswith("gpg"))
        rendered = run_rlkit("render", str(tmp_path / "clean.yaml"))
        assert rendered.returncode == 0 and rendered.stdout.startswith("#!/bin/bash"), rendered.stderr


@pytest.mark.parametrize(("change", "says"), [
    ({"algorithm.adv_estimator": "grpo_vectorized", "algorithm.norm_adv_by_std_in_grpo": False},
     "norm_adv_by_std_in_grpo False (t): verl's grpo_vectorized does not read it"),
    ({"algorithm.adv_estimator": "remax"}, "greedy completion of each prompt"),
    ({"algorithm.adv_estimator": "optimal_token_baseline"}, "sum of squared probabilities"),
])
def test_what_rlkit_cannot_reproduce_is_refused_with_why(change: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        verl_to_rlkit(dict(change), "t", REGISTRY.verl_estimators)
    assert says in str(info.value), str(info.value)


@pytest.mark.parametrize("epochs", [1, 2])
def test_the_gpg_loss_is_rlkit_s_gpg_loss_over_any_minibatches(epochs: int) -> None:
    """verl's gpg example: 4 minibatches (once refused: rlkit had no -log pi x A loss), its estimator's settings and
    actor.policy_loss gpg."""
    leaves = {"algorithm.adv_estimator": "gpg", "actor_rollout_ref.actor.policy_loss.loss_mode": "gpg",
              "data.train_batch_size": 64, "actor_rollout_ref.actor.ppo_mini_batch_size": 16,
              "actor_rollout_ref.actor.ppo_epochs": epochs}
    mapping, fates = verl_to_rlkit(leaves, "t", REGISTRY.verl_estimators)
    assert mapping["actor"]["ppo_n_minibatches"] == 4 and mapping["actor"]["gpg_scale"] is True
    assert mapping["actor"]["policy_loss"] == "gpg" and "use_sapo_loss" not in mapping["actor"]
    fate = {f.key: f.fate for f in fates}["actor_rollout_ref.actor.policy_loss.loss_mode"]
    assert fate.startswith("moved to actor.policy_loss gpg (-A log pi on every minibatch"), fate


def test_passk_s_std_switch_is_said_in_the_header() -> None:
    mapping, fates = verl_to_rlkit({"algorithm.adv_estimator": "grpo_passk",
                                    "algorithm.norm_adv_by_std_in_grpo": False}, "t", REGISTRY.verl_estimators)
    assert mapping["actor"]["reward_norm"] == {"mean_level": "group", "std_level": None, "eps": VERL_EPS}
    assert {f.key: f.fate for f in fates}["algorithm.norm_adv_by_std_in_grpo"] == \
        "moved to actor.reward_norm.std_level as null (the margin not divided by the std)"


KL_COEF = 0.1
OLD = [[-0.1 * (t + 1) for t in range(n)] for n in LENGTHS]  # the recomputed log-probs of each completion
REF = [[-0.3 + 0.05 * t for t in range(n)] for n in LENGTHS]  # the reference model's


def _summed_scores() -> list[float]:
    """verl's token_level_rewards summed over each sequence: the score on the last token, -kl_coef x KL on every
    token, KL its default estimator `kl` (old - ref, rlkit's k1)."""
    return [r - KL_COEF * sum(o - f for o, f in zip(old, ref, strict=True))
            for r, old, ref in zip(REWARDS, OLD, REF, strict=True)]


def _whitened(rows: list[list[float]]) -> list[list[float]]:
    """verl's masked_whiten over the batch's tokens: x rsqrt(unbiased variance + 1e-8) (rlkit's adv_norm divides by
    the std + 1e-5: equal within 1e-4, as session 39 measured for REINFORCE++)."""
    flat = [a for row in rows for a in row]
    mean = sum(flat) / len(flat)
    var = sum((a - mean) ** 2 for a in flat) / (len(flat) - 1)
    return [[(a - mean) / (var + 1e-8) ** 0.5 for a in row] for row in rows]


def grpo_reference(scores: list[float], size: int = GROUP) -> list[float]:
    """verl's grpo: (score - its group's mean) / (the group's unbiased std + eps)."""
    return [(r - sum(g) / len(g)) / (statistics.stdev(g) + VERL_EPS) for g in _by_group(scores, size) for r in g]


def _advantages_with_kl(actor: ActorConfig) -> list[list[float]]:
    samples = [Sample(prompt_ids=[1, 2], completion_ids=[5] * n, behav_logp=[-0.1] * n, reward=r, version=0,
                      finished=True, group=i // GROUP) for i, (r, n) in enumerate(zip(REWARDS, LENGTHS, strict=True))]
    batch = prepare_batch([samples[:GROUP], samples[GROUP:]], actor, max_new_tokens=8).samples
    token_advantages(batch, dict(enumerate(OLD)), dict(enumerate(REF)), actor)
    return [s.token_advantages or [] for s in batch]


@pytest.mark.parametrize(("estimator", "reference"), [
    ("grpo", lambda: _flat(grpo_reference(_summed_scores()))),
    ("grpo_vectorized", lambda: _flat(grpo_vectorized_reference(_summed_scores()))),
    ("rloo", lambda: _flat(rloo_vectorized_reference(_summed_scores()))),
    ("grpo_passk", lambda: _flat(passk_reference(_summed_scores(), GROUP, by_std=True))),
    ("opo", lambda: opo_reference(_summed_scores(), LENGTHS, GROUP)),
    ("gpg", lambda: _flat(gpg_reference(_summed_scores(), GROUP))),
    ("reinforce_plus_plus_baseline", lambda: _whitened(_flat(
        [r - sum(g) / len(g) for g in _by_group(_summed_scores()) for r in g]))),
])
def test_with_the_kl_reward_each_summed_estimator_gives_verl_s_advantages(tmp_path: Path, site: list[str],
                                                                          estimator: str, reference: object) -> None:
    """verl's use_kl_in_reward subtracts kl_coef x KL from each token's reward, then these estimators sum a
    sequence's token rewards into one score: the migrated settings (actor.kl_penalty_level: sequence) give the
    estimator's advantages of those penalised scores on every token (rlkit's per-token order, the default, would
    give each token its own return instead: this test fails with it)."""
    actor, said, _ = _actor_of(tmp_path, site, f"algorithm.adv_estimator={estimator} "
                                                f"algorithm.kl_ctrl.kl_coef={KL_COEF}", kl_in_reward=True)
    assert (actor.kl_ctl, actor.kl_estimator, actor.kl_penalty_level) == (KL_COEF, "k1", "sequence")
    assert "actor.kl_penalty_level: sequence" in said["algorithm.adv_estimator"], said["algorithm.adv_estimator"]
    got, expected = _advantages_with_kl(actor), reference()  # type: ignore[operator]
    rel = 1e-4 if estimator == "reinforce_plus_plus_baseline" else 1e-5  # the whitening's eps (_whitened)
    for row, want in zip(got, expected, strict=True):
        assert row == pytest.approx(want, rel=rel, abs=1e-6)


def test_reinforce_plus_plus_keeps_the_penalty_per_token(tmp_path: Path, site: list[str]) -> None:
    """verl's REINFORCE++ (and GAE) run their returns over the token rewards: rlkit's default order, written as is."""
    actor, _, _ = _actor_of(tmp_path, site, "algorithm.adv_estimator=reinforce_plus_plus", kl_in_reward=True)
    assert actor.kl_ctl == 0.001 and actor.kl_penalty_level == "token"
