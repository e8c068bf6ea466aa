"""Hand-computed cases for prepare_batch: overlong penalty, shaping, dynamic sampling, reward_norm (sequence level)."""

from __future__ import annotations

import math

import pytest

from rlkit.config.schema.actor import ActorConfig, NormConfig
from rlkit.trainer.rl_math.advantage_batch import prepare_batch
from rlkit.types import Sample

EPS = 1e-5
SQRT3 = math.sqrt(3.0)


def group(rewards: list[float], gid: int, lengths: list[int] | None = None) -> list[Sample]:
    lengths = lengths or [2] * len(rewards)
    return [Sample(prompt_ids=[1, 2], completion_ids=[5] * n, behav_logp=[-0.1] * n, reward=r, version=0,
                   finished=True, group=gid) for r, n in zip(rewards, lengths, strict=True)]


def actor(**kwargs: object) -> ActorConfig:
    norm = kwargs.pop("reward_norm", NormConfig(mean_level="group", std_level="group"))
    return ActorConfig(group_size=4, reward_norm=norm, **kwargs)  # type: ignore[arg-type]


def advs(samples: list[Sample]) -> list[float]:
    return [s.advantage for s in samples]


def test_group_normalisation_two_groups_of_four() -> None:
    # group 0: [1, 1, 0, 0]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 1/sqrt(3) -> +-0.5 * sqrt(3)
    # group 1: [1, 0, 0, 0]: mean 0.25, deviations [0.75, -0.25 x3], var 0.75 / 3 = 0.25, std 0.5
    groups = [group([1.0, 1.0, 0.0, 0.0], 0), group([1.0, 0.0, 0.0, 0.0], 1)]
    out = prepare_batch(groups, actor(), max_new_tokens=100)
    s = 1 / SQRT3 + EPS
    h = 0.5 + EPS
    expected = [0.5 / s, 0.5 / s, -0.5 / s, -0.5 / s, 0.75 / h, -0.25 / h, -0.25 / h, -0.25 / h]
    assert advs(out.samples) == pytest.approx(expected, rel=1e-5)
    assert advs(out.samples)[0] == pytest.approx(SQRT3 / 2, rel=1e-4)
    assert advs(out.samples)[4] == pytest.approx(1.5, rel=1e-4)
    assert [s.group for s in out.samples] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert out.dropped_groups == 0
    assert out.raw_rewards == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]


def test_leave_one_out_without_std() -> None:
    # RLOO baseline of [1, 0, 0, 0]: others' means 0, 1/3, 1/3, 1/3
    norm = NormConfig(mean_level="group", std_level="none", mean_leave1out=True)
    out = prepare_batch([group([1.0, 0.0, 0.0, 0.0], 0)], actor(reward_norm=norm), max_new_tokens=100)
    assert advs(out.samples) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])


def test_dynamic_sampling_drops_flat_groups() -> None:
    groups = [group([0.5, 0.5, 0.5, 0.5], 0), group([1.0, 1.0, 0.0, 0.0], 1), group([0.0] * 4, 2)]
    out = prepare_batch(groups, actor(dynamic_sampling=True), max_new_tokens=100)
    assert out.dropped_groups == 2
    assert [s.group for s in out.samples] == [1, 1, 1, 1]
    assert advs(out.samples) == pytest.approx([SQRT3 / 2, SQRT3 / 2, -SQRT3 / 2, -SQRT3 / 2], rel=1e-4)
    assert out.raw_rewards == [0.5] * 4 + [1.0, 1.0, 0.0, 0.0] + [0.0] * 4  # every group's rewards, dropped too


def test_without_dynamic_sampling_flat_groups_stay_with_zero_advantage() -> None:
    out = prepare_batch([group([0.5] * 4, 0), group([1.0, 1.0, 0.0, 0.0], 1)], actor(), max_new_tokens=100)
    assert out.dropped_groups == 0
    assert len(out.samples) == 8
    assert advs(out.samples)[:4] == [0.0, 0.0, 0.0, 0.0]


def test_dynamic_sampling_all_flat_returns_no_samples() -> None:
    groups = [group([1.0] * 4, 0), group([0.0] * 4, 1)]
    out = prepare_batch(groups, actor(dynamic_sampling=True), max_new_tokens=100)
    assert out.samples == []
    assert out.dropped_groups == 2
    assert out.raw_rewards == [1.0] * 4 + [0.0] * 4


def test_reward_shaping_bias_scaling_clip_without_normalisation() -> None:
    # (r + 1) * 2, clipped to [-5, 5]: 1 -> 4, 0 -> 2, -1 -> 0, 3 -> 8 -> 5
    norm = NormConfig(mean_level="none", std_level="none")
    a = actor(reward_norm=norm, reward_bias=1.0, reward_scaling=2.0, reward_clip=5.0)
    out = prepare_batch([group([1.0, 0.0, -1.0, 3.0], 0)], a, max_new_tokens=100)
    assert advs(out.samples) == pytest.approx([4.0, 2.0, 0.0, 5.0])
    assert [s.info["shaped_reward"] for s in out.samples] == pytest.approx([4.0, 2.0, 0.0, 5.0])
    assert out.raw_rewards == [1.0, 0.0, -1.0, 3.0]
    assert [s.reward for s in out.samples] == [1.0, 0.0, -1.0, 3.0]  # the samples keep their raw reward


def test_clip_applies_before_the_group_mean() -> None:
    # clip 5: [10, 2, 0, 0] -> [5, 2, 0, 0], mean 1.75 -> [3.25, 0.25, -1.75, -1.75] (unclipped: [7, -1, -3, -3])
    norm = NormConfig(mean_level="group", std_level="none")
    out = prepare_batch([group([10.0, 2.0, 0.0, 0.0], 0)], actor(reward_norm=norm, reward_clip=5.0), max_new_tokens=100)
    assert advs(out.samples) == pytest.approx([3.25, 0.25, -1.75, -1.75])
    assert out.raw_rewards == [10.0, 2.0, 0.0, 0.0]


def test_overlong_penalty_applied() -> None:
    # max_new_tokens 10, overlong_tokens 4 -> expected length 6; penalty min((L - 6) / 4, 1) * 1.0
    # lengths 4, 6, 8, 10 -> penalties 0, 0, 0.5, 1
    norm = NormConfig(mean_level="none", std_level="none")
    a = actor(reward_norm=norm, overlong_reward_penalty=True, overlong_tokens=4, overlong_penalty_factor=1.0)
    out = prepare_batch([group([1.0] * 4, 0, lengths=[4, 6, 8, 10])], a, max_new_tokens=10)
    assert advs(out.samples) == pytest.approx([1.0, 1.0, 0.5, 0.0])
    assert [s.info["shaped_reward"] for s in out.samples] == pytest.approx([1.0, 1.0, 0.5, 0.0])
    assert out.raw_rewards == [1.0] * 4


def test_overlong_penalty_off_unless_enabled() -> None:
    norm = NormConfig(mean_level="none", std_level="none")
    a = actor(reward_norm=norm, overlong_reward_penalty=False, overlong_tokens=4, overlong_penalty_factor=1.0)
    out = prepare_batch([group([1.0] * 4, 0, lengths=[4, 6, 8, 10])], a, max_new_tokens=10)
    assert advs(out.samples) == pytest.approx([1.0, 1.0, 1.0, 1.0])


def test_overlong_penalty_on_the_raw_reward_then_shaping_then_normalised() -> None:
    # AReaL's order (areal/trainer/ppo/actor.py at 4aef98d8): penalty 2 * [0, 0, 0.5, 1] on the raw reward 1 ->
    # [1, 1, 0, -1]; then (r + 1) * 3 -> [6, 6, 3, 0]; group mean 3.75 -> [2.25, 2.25, -0.75, -3.75]
    norm = NormConfig(mean_level="group", std_level=None)
    a = actor(reward_norm=norm, reward_bias=1.0, reward_scaling=3.0, overlong_reward_penalty=True, overlong_tokens=4,
              overlong_penalty_factor=2.0)
    out = prepare_batch([group([1.0] * 4, 0, lengths=[4, 6, 8, 10])], a, max_new_tokens=10)
    assert advs(out.samples) == pytest.approx([2.25, 2.25, -0.75, -3.75])


@pytest.mark.parametrize("sizes", [[3, 3], [4, 3], [5]])
def test_wrong_group_size_raises(sizes: list[int]) -> None:
    groups = [group([float(i % 2) for i in range(n)], g) for g, n in enumerate(sizes)]
    with pytest.raises(ValueError, match=r"expected actor\.group_size=4"):
        prepare_batch(groups, actor(), max_new_tokens=100)
