"""The reward and advantage pipeline computes what AReaL computes under the same names (issue 17).

References: AReaL (github.com/inclusionAI/AReaL) at commit 4aef98d8 — `Normalization` and `KLEstimator` in
areal/utils/data.py, `PPOActor._compute_advantages` in areal/trainer/ppo/actor.py, the gsm8k GRPO recipe in
examples/math/gsm8k_grpo.yaml. Numbers marked "AReaL's output" were produced once by running those AReaL functions
on the inputs below (float64 in, AReaL returns float32) and are hard-coded here.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.config.schema.actor import ActorConfig, NormConfig
from rlkit.trainer.rl_math.advantage_batch import prepare_batch, token_advantages
from rlkit.trainer.rl_math.gae import gae_advantages, token_rewards
from rlkit.trainer.rl_math.normalization import normalize
from rlkit.types import Sample

ISSUE_REWARDS = torch.tensor([1.0, 1, 1, 1, 0, 1, 0, 1])


def norm(mean: str | None, std: str | None, **kw: object) -> torch.Tensor:
    return normalize(ISSUE_REWARDS, mean_level=mean, std_level=std, group_size=4, **kw)  # type: ignore[arg-type]


# --- mixed normalisation levels (areal/utils/data.py Normalization at 4aef98d8) --------------------------------

def test_batch_mean_group_std_keeps_a_flat_group_finite() -> None:
    """Issue: rlkit gave 25000 to the flat group (its own std is 0); AReaL takes the std around the batch mean
    0.75 that it subtracted: 0.25 / sqrt(4 * 0.0625 / 3) = 0.866."""
    out = norm("batch", "group")
    assert out.tolist() == pytest.approx([0.8659954, 0.8659954, 0.8659954, 0.8659954,  # AReaL's output
                                          -1.161877, 0.3872923, -1.161877, 0.3872923], abs=1e-6)


def test_no_mean_group_std() -> None:
    """Issue: rlkit gave 1e5; AReaL's std is taken around 0 (no mean subtracted): 1 / sqrt(4/3) = 0.866."""
    assert norm(None, "group").tolist() == pytest.approx([0.8660179] * 4 + [0.0, 1.2247298, 0.0, 1.2247298],
                                                         abs=1e-6)  # AReaL's output
    assert norm("none", "group").tolist() == norm(None, "group").tolist()  # rlkit's older spelling of None


def test_group_mean_batch_std() -> None:
    """Issue: rlkit gave +-1.080 (std of the raw batch); AReaL's std is around the group means: +-1.323."""
    assert norm("group", "batch").tolist() == pytest.approx([0.0] * 4 + [-1.3228407, 1.3228407] * 2, abs=1e-6)


def test_group_group_is_the_textbook_formula_and_leave_one_out_as_areal() -> None:
    out = norm("group", "group")
    assert out[:4].tolist() == [0.0] * 4  # a flat group: 0 / (0 + eps)
    assert out[4:].tolist() == pytest.approx([-math.sqrt(3) / 2, math.sqrt(3) / 2] * 2, abs=1e-4)
    loo = normalize(torch.tensor([3.0, 1, 0, 4, 2, 2, 2, 5]), mean_level="group", std_level="group", group_size=4,
                    mean_leave1out=True)  # std around each sample's leave-one-out mean
    assert loo.tolist() == pytest.approx([0.5477203, -0.5477203, -1.0954406, 1.0954405,  # AReaL's output
                                          -0.4999975, -0.4999975, -0.4999975, 1.4999925], abs=1e-6)


def test_eps_only_when_dividing_by_a_std() -> None:
    # mean only: exactly r - mean (AReaL sets eps to 0 without a std level)
    assert norm("group", None, eps=0.5).tolist() == [0.0] * 4 + [-0.5, 0.5, -0.5, 0.5]


# --- random-input properties --------------------------------------------------------------------------------

def test_group_group_equals_textbook_on_random_rewards() -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        r = torch.randn(6 * 5, generator=g, dtype=torch.float64)
        x = r.view(6, 5)
        textbook = (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + 1e-5)
        got = normalize(r, mean_level="group", std_level="group", group_size=5)
        assert float((got - textbook.flatten()).abs().max()) < 1e-6


@pytest.mark.parametrize("mean", ["batch", "group", None])
@pytest.mark.parametrize("std", ["batch", "group"])
def test_flat_groups_never_exceed_the_bound(mean: str | None, std: str) -> None:
    """Every normalised value is at most sqrt(n - 1) in size, n the std's slice (Samuelson's inequality around
    whatever mean was subtracted), whatever the data: flat groups included, 0/1 rewards included."""
    g = torch.Generator().manual_seed(1)
    n = 4 if std == "group" else 32
    for trial in range(30):
        r = torch.randint(0, 2, (32,), generator=g).double() if trial % 2 else torch.randn(32, generator=g)
        r[:4] = r[0]  # a flat first group
        out = normalize(r, mean_level=mean, std_level=std, group_size=4)
        assert torch.isfinite(out).all()
        assert float(out.abs().max()) <= math.sqrt(n - 1) + 1e-6


def test_token_level_stats_are_token_weighted_and_bessel_corrected() -> None:
    x = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    out = normalize(x, mask, eps=0.0)  # 4 tokens: mean 1.75, sum of squares 3 * 0.5625 + 5.0625 = 6.75, / 3
    std = math.sqrt(6.75 / 3)
    assert out.tolist()[0] == pytest.approx([-0.75 / std] * 3)
    assert out.tolist()[1] == pytest.approx([2.25 / std, 0.0, 0.0])


# --- reward pipeline order (areal/trainer/ppo/actor.py _compute_advantages at 4aef98d8) ------------------------

def _one(reward: float, length: int, **kw: object) -> float:
    actor = ActorConfig(group_size=1, overlong_reward_penalty=True, overlong_tokens=4, overlong_penalty_factor=1.0,
                        **kw)  # type: ignore[arg-type]
    s = Sample([1], [5] * length, [0.0] * length, reward, 0, True, 0)
    return prepare_batch([[s]], actor, max_new_tokens=10).samples[0].advantage


def test_overlong_penalty_on_the_raw_reward() -> None:
    """Issue: r = 1, penalty 0.5 (length 8 of 10, zone 4): scaling 2 gives (1 - 0.5) * 2 = 1.0 (rlkit gave 1.5);
    reward_clip 0.6 gives min(1 - 0.5, 0.6) = 0.5 (rlkit gave 0.1)."""
    assert _one(1.0, 8, reward_scaling=2.0) == pytest.approx(1.0)
    assert _one(1.0, 8, reward_clip=0.6) == pytest.approx(0.5)


# --- KL reward penalty and GAE ----------------------------------------------------------------------------------

def test_kl_ctl_is_a_reward_without_gradient() -> None:
    kl = torch.tensor([[0.5, 1.0, 2.0]], requires_grad=True)
    rewards = token_rewards(torch.tensor([1.0]), torch.ones(1, 3, dtype=torch.bool), kl, kl_ctl=0.1)
    assert not rewards.requires_grad
    assert rewards[0].tolist() == pytest.approx([-0.05, -0.1, 0.8])
    adv, returns = gae_advantages(rewards, torch.ones(1, 3))
    assert adv[0].tolist() == pytest.approx([0.65, 0.7, 0.8])  # lambda = 1, no critic: the reward-to-go
    assert returns.tolist() == adv.tolist()


def test_gae_with_a_critic_skips_masked_positions() -> None:
    # masked middle position is skipped: A_2 = r2 - V2 = 1 - .5; A_0 = r0 + g V2 - V0 + g l A_2
    r = torch.tensor([[0.0, 9.0, 1.0]])
    mask = torch.tensor([[1, 0, 1]])
    v = torch.tensor([[0.2, 7.0, 0.5]])
    adv, returns = gae_advantages(r, mask, discount=0.9, gae_lambda=0.8, values=v)
    a2 = 0.5
    a0 = 0.9 * 0.5 - 0.2 + 0.9 * 0.8 * a2
    assert adv[0].tolist() == pytest.approx([a0, 0.0, a2])
    assert returns[0].tolist() == pytest.approx([a0 + 0.2, 0.0, a2 + 0.5])


# --- AReaL's gsm8k GRPO recipe on a fixed batch ---------------------------------------------------------------

PROMPTS = [3, 2, 4, 3, 2, 3, 2, 4]
COMPLETIONS = [2, 4, 3, 1, 4, 2, 3, 2]
REWARDS = [1, 1, 1, 1, 0, 1, 0, 0]  # group 0 is flat


def _logps(i: int, j: int) -> tuple[float, float]:
    old = -0.1 * (i + 1) - 0.05 * j
    ref = old + 0.3 * ((i + j) % 3 - 1)
    if (i, j) == (1, 2):
        ref = old + 12.0  # k3 = e^12 - 13 = 1.6e5 unclamped: AReaL's estimator clamps it to 10
    return round(old, 6), round(ref, 6)


def _recipe_batch(**kw: object) -> list[list[float] | None]:
    recipe = {"reward_scaling": 10.0, "reward_bias": -0.5, "reward_norm": NormConfig("group", "group"),
              "adv_norm": NormConfig("batch", "batch"), **kw}
    actor = ActorConfig(group_size=4, **recipe)  # type: ignore[arg-type]
    samples = [Sample([0] * p, [1] * c, [0.0] * c, float(r), 0, True, i // 4)
               for i, (p, c, r) in enumerate(zip(PROMPTS, COMPLETIONS, REWARDS, strict=True))]
    batch = prepare_batch([samples[:4], samples[4:]], actor, max_new_tokens=16)
    old = {i: [_logps(i, j)[0] for j in range(c)] for i, c in enumerate(COMPLETIONS)}
    ref = {i: [_logps(i, j)[1] for j in range(c)] for i, c in enumerate(COMPLETIONS)}
    token_advantages(batch.samples, old, ref, actor)
    return [s.token_advantages for s in batch.samples]


def _close(got: list[list[float] | None], expected: list[list[float]]) -> None:
    assert [len(g or []) for g in got] == [len(e) for e in expected]
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e, abs=1e-6)


def test_gsm8k_recipe_advantages_as_areal() -> None:
    """reward_scaling 10, bias -0.5, reward_norm group/group, adv_norm batch/batch, kl_ctl 0: the flat group
    keeps a small advantage (its reward is above the batch's token mean), where rlkit used to give 0."""
    expected = [[0.12393727] * 2, [0.12393727] * 4, [0.12393727] * 3, [0.12393727],  # AReaL's output
                [-0.74362367] * 4, [2.7266202] * 2, [-0.74362367] * 3, [-0.74362367] * 2]
    _close(_recipe_batch(), expected)


def test_gsm8k_recipe_with_a_k3_kl_penalty_as_areal() -> None:
    expected = [[0.32418761, 0.33034927], [-1.18671763, -1.18671763, -1.17919123, 0.33034927],  # AReaL's output
                [0.31666121, 0.32418761, 0.33034927], [0.32418761],
                [-0.43810752, -0.43810752, -0.43058115, -0.42441943], [2.58096743, 2.58849382],
                [-0.43810752, -0.4319458, -0.4319458], [-0.4319458, -0.4319458]]
    _close(_recipe_batch(kl_ctl=0.1, kl_estimator="k3"), expected)


def test_k1_penalty_with_discount_and_lambda_as_areal() -> None:
    expected = [[0.70500004, 1.0], [0.64324802, 0.89340001, 1.22000003, 1.0], [0.52260005, 0.70500004, 1.0],
                [0.98500001], [0.003024, 0.0042, -0.015, 0.0], [0.72420001, 0.98500001],  # AReaL's output
                [-0.007224, 0.0108, 0.015], [0.0108, 0.015]]
    _close(_recipe_batch(kl_ctl=0.05, kl_estimator="k1", discount=0.9, gae_lambda=0.8, reward_scaling=1.0,
                         reward_bias=0.0, reward_norm=None, adv_norm=None), expected)
