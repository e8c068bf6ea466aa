"""Hand-computed cases for OPMD's advantage and loss and for the SFT+RL mix (Trinity-RFT's formulas, written out in
rlkit.trainer.rl_math.opmd's docstring)."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.trainer.rl_math.opmd import mixed_loss, opmd_advantages, opmd_baselines, opmd_policy_loss, sft_nll


def t(*rows: object) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def close(actual: torch.Tensor, expected: object, tol: float = 1e-9) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=tol, rtol=0.0)


def test_mean_baseline_is_the_group_mean_without_a_std() -> None:
    rewards = t([1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0])
    close(opmd_advantages(rewards), [[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]])


def test_logavgexp_baseline_by_hand() -> None:
    # tau = 1, group [1, 0]: log((e^1 + e^0) / 2) = log(1.859140914) = 0.620114506
    close(opmd_baselines(t([1.0, 0.0]), baseline="logavgexp", tau=1.0), [0.620114506], tol=1e-9)
    # tau = 0.5, group [1, 0]: 0.5 * log((e^2 + 1) / 2) = 0.5 * 1.433780830 = 0.716890415
    close(opmd_baselines(t([1.0, 0.0]), baseline="logavgexp", tau=0.5), [0.716890415], tol=1e-9)
    # a soft maximum: between the mean and the max, towards the mean as tau grows
    wide = opmd_baselines(t([1.0, 0.0]), baseline="logavgexp", tau=100.0)
    assert 0.5 < float(wide[0]) < 0.5025


def test_a_group_of_one_has_baseline_zero() -> None:
    close(opmd_advantages(t([0.7], [0.2]), baseline="logavgexp"), [[0.7], [0.2]])


def test_baseline_and_tau_are_checked() -> None:
    with pytest.raises(ValueError, match="baseline"):
        opmd_baselines(t([1.0, 0.0]), baseline="median")
    with pytest.raises(ValueError, match="tau"):
        opmd_baselines(t([1.0, 0.0]), tau=0.0)


def test_opmd_loss_by_hand_value_and_gradient() -> None:
    # mask [1, 1, 0]: (-(2)(-1) + -(2)(-2)) / 2 tokens = 3, / (1 + tau) = 1.5 with tau = 1
    logp = t([-1.0, -2.0, -3.0]).requires_grad_(True)
    adv, mask = t([2.0, 2.0, -1.0]), t([1.0, 1.0, 0.0])
    loss, stats = opmd_policy_loss(logp, adv, mask, tau=1.0)
    close(loss.detach(), 1.5)
    close(stats["opmd_loss"], 1.5)
    loss.backward()
    assert logp.grad is not None
    close(logp.grad, [[-0.5, -0.5, 0.0]])  # -A / (tokens * (1 + tau)); the masked token gets none
    loss3, _ = opmd_policy_loss(logp.detach(), adv, mask, tau=3.0)
    close(loss3, 0.75)


def test_opmd_loss_ignores_garbage_in_masked_positions() -> None:
    loss, _ = opmd_policy_loss(t([-1.0, float("-inf")]), t([1.0, 5.0]), t([1.0, 0.0]), tau=1.0)
    close(loss, 0.5)


def test_sft_nll_and_the_mix() -> None:
    logp = t([-0.5, -1.5, -9.0])
    mask = t([1.0, 1.0, 0.0])
    close(sft_nll(logp, mask), 1.0)
    # Trinity-RFT's default mu = 0.1: 0.9 * 2 + 0.1 * 1 = 1.9
    close(mixed_loss(torch.tensor(2.0), torch.tensor(1.0), 0.1), 1.9)
    with pytest.raises(ValueError, match="mu"):
        mixed_loss(torch.tensor(2.0), torch.tensor(1.0), 1.5)
    assert math.isclose(float(mixed_loss(torch.tensor(2.0), torch.tensor(1.0), 0.0)), 2.0)
