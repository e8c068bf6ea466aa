"""Numerical guards and the decoupled loss's two AReaL forms (issue 17).

References: AReaL areal/utils/data.py `KLEstimator` (clamp to [-10, 10]) and areal/utils/functional/functional.py
`apply_rejection_sampling` / `ppo_actor_loss_fn` at 4aef98d8, `behav_imp_weight_cap` at 61d1bbb3; verl
verl/trainer/ppo/core_algos.py at b178a3cd (log-ratio clamped to +-20 before exp, GSPO's sequence log-ratio to at
most 10, k3 clamped to 10, TIS truncation).
"""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.config.schema.actor import RejectionSamplingConfig
from rlkit.trainer.rl_math.kl import kl_estimate
from rlkit.trainer.rl_math.losses import ppo_actor_loss
from rlkit.trainer.rl_math.rejection import behaviour_weights


def f64(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# --- KL estimator clamp ---------------------------------------------------------------------------------------

def test_k3_far_from_the_reference_is_at_most_the_clamp() -> None:
    """Issue: unclamped k3 at logp - ref = -10.5 was 36304 and at -20 4.85e8; AReaL clamps to 10."""
    logp = torch.tensor([-10.5, -20.0, -0.5], dtype=torch.float64, requires_grad=True)
    kl, clamped = kl_estimate(logp, torch.zeros(3, dtype=torch.float64), "k3")
    assert kl.tolist() == pytest.approx([10.0, 10.0, math.exp(0.5) - 1.5])
    assert clamped.tolist() == [True, True, False]
    kl.sum().backward()
    assert logp.grad is not None and logp.grad.tolist() == pytest.approx([0.0, 0.0, 1 - math.exp(0.5)])
    unclamped, none = kl_estimate(logp.detach(), torch.zeros(3, dtype=torch.float64), "k3", clamp=None)
    assert unclamped[0] == pytest.approx(math.exp(10.5) - 11.5) and not none.any()


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_gradients_are_finite_for_log_ratios_up_to_50(estimator: str) -> None:
    d = torch.linspace(-50, 50, 41, dtype=torch.float64)
    for clamp in (10.0, None):
        logp = d.clone().requires_grad_()
        kl, _ = kl_estimate(logp, torch.zeros_like(d), estimator, clamp=clamp)
        kl.sum().backward()
        assert logp.grad is not None and torch.isfinite(logp.grad).all() and torch.isfinite(kl).all()


# --- log-ratio clamps ---------------------------------------------------------------------------------------------

def test_one_extreme_token_gives_a_bounded_loss_and_gradient() -> None:
    """Issue: log-ratio 25 on a negative-advantage token, no dual clip: 7.2e10 before; verl clamps at 20."""
    logp = f64([[25.0, 0.1]]).requires_grad_()
    loss, stats = ppo_actor_loss(logp, torch.zeros_like(logp), f64([[-1.0, 1.0]]), torch.ones_like(logp))
    assert float(loss.detach()) == pytest.approx((math.exp(20.0) - math.exp(0.1)) / 2)
    assert float(stats["log_ratio_clamped"]) == 1.0
    loss.backward()
    assert logp.grad is not None  # none past the clamp
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -math.exp(0.1) / 2])
    off, stats = ppo_actor_loss(logp.detach(), torch.zeros_like(logp), f64([[-1.0, 1.0]]), torch.ones_like(logp),
                                log_ratio_clamp=None)
    assert float(off) == pytest.approx((math.exp(25.0) - math.exp(0.1)) / 2) and "log_ratio_clamped" not in stats


def test_gspo_sequence_log_ratio_is_clamped_at_10() -> None:
    logp = f64([[12.0, 14.0], [0.1, 0.1]])
    loss, stats = ppo_actor_loss(logp, torch.zeros_like(logp), -torch.ones_like(logp), torch.ones_like(logp),
                                 importance_sampling_level="sequence")
    assert float(loss) == pytest.approx((2 * math.exp(10.0) + 2 * math.exp(0.1)) / 4)
    assert float(stats["seq_log_ratio_clamped"]) == 1.0


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("c_clip", [None, 3.0])
def test_gradients_finite_for_log_ratios_up_to_50(level: str, c_clip: float | None) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        logp = (torch.rand(4, 6, generator=g, dtype=torch.float64) * 100 - 50).requires_grad_()
        behav = torch.rand(4, 6, generator=g, dtype=torch.float64) * 100 - 50
        adv = torch.randn(4, 6, generator=g, dtype=torch.float64)
        mask = torch.rand(4, 6, generator=g) > 0.2
        for rs in (None, RejectionSamplingConfig(action="clamp")):
            loss, _ = ppo_actor_loss(logp, torch.zeros_like(logp), adv, mask, c_clip=c_clip,
                                     importance_sampling_level=level, behav_logp=behav,  # type: ignore[arg-type]
                                     rejection_sampling=rs)
            logp.grad = None
            loss.backward()
            assert torch.isfinite(loss) and logp.grad is not None and torch.isfinite(logp.grad).all()


# --- decoupled loss: behav_imp_weight_cap and rejection_sampling -----------------------------------------------

PROX = f64([[0.0, math.log(2.0), math.log(5.0)], [math.log(4.0), math.log(4.0), 0.0]])
BEHAV = torch.zeros_like(PROX)
MASK = torch.ones_like(PROX, dtype=torch.bool)


def test_cap_is_token_mask_ratio_rejection() -> None:
    """AReaL 61d1bbb3's behav_imp_weight_cap = 3 equals {token, mask, ratio, upper 3} at 4aef98d8."""
    adv = torch.ones_like(PROX)
    capped, s1 = ppo_actor_loss(PROX.clone(), PROX, adv, MASK, behav_logp=BEHAV, behav_imp_weight_cap=3.0)
    block = RejectionSamplingConfig(level="token", action="mask", metric="ratio", upper=3.0)
    same, s2 = ppo_actor_loss(PROX.clone(), PROX, adv, MASK, behav_logp=BEHAV, rejection_sampling=block)
    assert float(capped) == float(same) == pytest.approx(-(1 + 2 + 0 + 0 + 0 + 1) / 6)  # 4 and 5 dropped
    assert float(s1["behav_filtered_fraction"]) == float(s2["behav_filtered_fraction"]) == pytest.approx(0.5)


def test_clamp_truncates_where_mask_drops() -> None:
    """verl's TIS: a weight over the cap becomes the cap (rlkit used to zero it)."""
    rs = RejectionSamplingConfig(action="clamp", upper=3.0)
    out = behaviour_weights(PROX, BEHAV, MASK, rs)
    assert out.weight.tolist() == [[1.0, 2.0, 3.0], [3.0, 3.0, 1.0]]
    assert out.mask.all() and float(out.filtered_fraction) == pytest.approx(0.5)
    lower = behaviour_weights(PROX, BEHAV, MASK, RejectionSamplingConfig(action="clamp", upper=3.0, lower=1.5))
    assert lower.weight[0].tolist() == [1.5, 2.0, 3.0]


def test_sequence_level_uses_the_geometric_mean() -> None:
    # row 0: geometric mean (1 * 2 * 5) ** (1/3) = 2.154 (kept under 3); row 1: (4 * 4 * 1) ** (1/3) = 2.52
    rs = RejectionSamplingConfig(level="sequence", upper=2.3)
    out = behaviour_weights(PROX, BEHAV, MASK, rs)
    assert out.mask.tolist() == [[True] * 3, [False] * 3]
    assert out.weight[0].tolist() == pytest.approx([10 ** (1 / 3)] * 3) and out.weight[1].tolist() == [0.0] * 3
    mx = behaviour_weights(PROX, BEHAV, MASK, RejectionSamplingConfig(level="sequence", agg="max", upper=4.5))
    assert mx.mask.tolist() == [[False] * 3, [True] * 3]  # max ratio 5 > 4.5 drops row 0


def test_kl_metric_masks_by_the_estimate() -> None:
    # k1 metric = prox - behav = log r: upper log 3 keeps ratios 1, 2, 1
    rs = RejectionSamplingConfig(metric="kl_k1", upper=math.log(3.0))
    out = behaviour_weights(PROX, BEHAV, MASK, rs)
    assert out.mask.tolist() == [[True, True, False], [False, False, True]]


def test_gspo_averages_the_sequence_log_ratio_over_kept_tokens() -> None:
    """AReaL 4aef98d8: rejection updates the mask before GSPO's sequence mean."""
    logp = f64([[0.3, 0.3, 9.0]])
    old = f64([[0.0, 0.0, 0.0]])
    behav = f64([[0.0, 0.0, -5.0]])  # third token's behaviour weight e^5 > 3: dropped
    loss, _ = ppo_actor_loss(logp, old, torch.ones_like(logp), torch.ones_like(logp, dtype=torch.bool),
                             importance_sampling_level="sequence", behav_logp=behav, behav_imp_weight_cap=3.0,
                             eps_clip=10.0)
    assert float(loss) == pytest.approx(-2 * math.exp(0.3) / 3)  # denominator: the original 3 tokens
