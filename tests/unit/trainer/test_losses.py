"""Hand-computed cases for reward shaping and the PPO/GRPO/GSPO actor loss."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.trainer.rl_math.advantages import overlong_penalty, shape_rewards
from rlkit.trainer.rl_math.kl import kl_estimate
from rlkit.trainer.rl_math.losses import entropy_from_logits, ppo_actor_loss

SQRT3 = math.sqrt(3.0)


def t(*values: object) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def close(actual: torch.Tensor, expected: object, tol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=tol, rtol=0.0)


def single(ratio: float, adv: float, **kwargs: object) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO loss for one token with the given ratio (old_logp = 0) and advantage."""
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64)
    return ppo_actor_loss(logp, torch.zeros_like(logp), torch.tensor([[adv]], dtype=torch.float64),
                          torch.ones_like(logp), **kwargs)  # type: ignore[arg-type]


# --- reward shaping ---------------------------------------------------------------------------------------------

def test_shape_rewards_bias_scaling_and_clip() -> None:
    close(shape_rewards(t(1.0, -3.0, 30.0, -30.0), reward_bias=1.0, reward_scaling=2.0), [4.0, -4.0, 20.0, -20.0])
    close(shape_rewards(t(1.0, -3.0, 30.0), reward_bias=1.0, reward_scaling=2.0, reward_clip=5.0), [4.0, -4.0, 5.0])
    close(shape_rewards(t(0.5, -0.5)), [0.5, -0.5])


def test_overlong_penalty_below_at_above_and_saturated() -> None:
    # expected = 100 - 20 = 80; penalty = min((L - 80) / 20, 1) * 2
    lengths = torch.tensor([70, 80, 90, 100, 120])
    out = overlong_penalty(torch.ones(5, dtype=torch.float64), lengths, max_new_tokens=100, overlong_tokens=20,
                           overlong_penalty_factor=2.0)
    close(out, [1.0, 1.0, 0.0, -1.0, -1.0])


# --- KL and entropy ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("estimator", "expected"),
    # logp = log .5, ref = log .25: d = log 2; k2 = d^2 / 2; k3 = exp(-d) + d - 1 = .5 + log 2 - 1
    [("k1", math.log(2)), ("k2", 0.5 * math.log(2) ** 2), ("k3", math.log(2) - 0.5)],
)
def test_kl_estimators(estimator: str, expected: float) -> None:
    out, _ = kl_estimate(t(math.log(0.5), 0.0), t(math.log(0.25), 0.0), estimator)
    close(out, [expected, 0.0])


def test_kl_unknown_estimator() -> None:
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(t(0.0), t(0.0), "k4")


def test_entropy_from_logits() -> None:
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, -math.inf, -math.inf]])
    close(entropy_from_logits(logits), [math.log(4.0), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))], 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_entropy_statistic_is_the_entropy_in_blocks(dtype: torch.dtype) -> None:
    """The no-gradient statistic (in place, a block of positions at a time) equals entropy_from_logits at the
    temperature, with -inf logits, blocks that do not divide the positions, and bf16 logits (computed in float32)."""
    from rlkit.trainer.rl_math.losses import entropy_statistic

    logits = (torch.randn(2, 5, 37, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    logits[0, 1, :30] = -math.inf
    logits[1, 4, 5] = -math.inf
    for temperature in (1.0, 0.7):
        want = entropy_from_logits(logits.float() / temperature)
        for block in (1, 3, 1024):
            got = entropy_statistic(logits, temperature, block=block)
            assert got.shape == (2, 5) and got.dtype == torch.float32 and not got.requires_grad
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# --- PPO actor loss ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("ratio", "adv", "loss", "clipped"),
    [
        (1.1, 1.0, -1.1, 0.0),  # inside
        (1.5, 1.0, -1.2, 1.0),  # above 1 + eps, A > 0: clipped
        (0.5, 1.0, -0.5, 0.0),  # below 1 - eps, A > 0: the unclipped term is the min
        (0.5, -1.0, 0.8, 1.0),  # below 1 - eps, A < 0: clipped
        (1.5, -1.0, 1.5, 0.0),  # above 1 + eps, A < 0: not clipped
        (0.9, -2.0, 1.8, 0.0),  # inside, A < 0
    ],
)
def test_ppo_clip(ratio: float, adv: float, loss: float, clipped: float) -> None:
    out, stats = single(ratio, adv)
    close(out, loss)
    close(stats["clip_fraction"], clipped)
    close(stats["importance_weight_mean"], ratio)


def test_eps_clip_higher_is_asymmetric() -> None:
    out, stats = single(1.25, 1.0, eps_clip=0.2, eps_clip_higher=0.28)
    close(out, -1.25)
    close(stats["clip_fraction"], 0.0)
    out, stats = single(1.25, 1.0, eps_clip=0.2)
    close(out, -1.2)
    close(stats["clip_fraction"], 1.0)
    out, _ = single(1.3, 1.0, eps_clip=0.2, eps_clip_higher=0.28)
    close(out, -1.28)
    out, _ = single(0.7, -1.0, eps_clip=0.2, eps_clip_higher=0.28)  # the lower bound is still 1 - eps_clip
    close(out, 0.8)


def test_dual_clip() -> None:
    out, stats = single(5.0, -1.0)
    close(out, 5.0)
    close(stats["dual_clip_fraction"], 0.0)
    out, stats = single(5.0, -1.0, c_clip=3.0)
    close(out, 3.0)
    close(stats["dual_clip_fraction"], 1.0)
    out, stats = single(2.0, -1.0, c_clip=3.0)  # 2 < 3: untouched
    close(out, 2.0)
    close(stats["dual_clip_fraction"], 0.0)
    out, _ = single(5.0, 1.0, c_clip=3.0)  # A > 0: ordinary clip
    close(out, -1.2)
    with pytest.raises(ValueError, match="c_clip"):
        single(1.0, 1.0, c_clip=1.0)


def test_token_mean_and_stats() -> None:
    logp = torch.tensor([[math.log(1.1), math.log(1.5)]], dtype=torch.float64)
    out, stats = ppo_actor_loss(logp, torch.zeros_like(logp), torch.ones_like(logp), torch.ones_like(logp))
    close(out, (-1.1 - 1.2) / 2)
    close(stats["clip_fraction"], 0.5)
    close(stats["importance_weight_mean"], 1.3)
    close(stats["importance_weight_max"], 1.5)
    # AReaL's sign (ppo_actor_loss_fn at 4aef98d8): approx_kl = logp - old_logp
    close(stats["approx_kl"], (math.log(1.1) + math.log(1.5)) / 2)
    assert "behav_weight_mean" not in stats
    assert all(not v.requires_grad and v.dim() == 0 for v in stats.values())


def test_padded_tokens_do_not_count() -> None:
    old = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 7.0], [-1.0, 9.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    logp = torch.tensor([[math.log(1.1), math.log(0.9), 0.0], [math.log(1.1), 0.0, 0.0]], dtype=torch.float64)
    out, stats = ppo_actor_loss(logp, old, adv, mask)
    close(out, (-1.1 - 0.9 + 1.1) / 3)
    garbage = logp.clone()
    garbage[0, 2], garbage[1, 1], garbage[1, 2] = 100.0, -math.inf, math.nan
    out2, stats2 = ppo_actor_loss(garbage.requires_grad_(), old, adv, mask)
    close(out2, (-1.1 - 0.9 + 1.1) / 3)
    for key in ("clip_fraction", "importance_weight_mean", "importance_weight_max", "approx_kl"):
        close(stats2[key], stats[key].item())
    out2.backward()
    assert garbage.grad is not None
    close(garbage.grad, [[-1.1 / 3, -0.9 / 3, 0.0], [1.1 / 3, 0.0, 0.0]])


def test_gradient_is_zero_for_clipped_tokens() -> None:
    logp = torch.tensor([[math.log(1.5), math.log(1.1), math.log(0.5), math.log(0.5)]], dtype=torch.float64)
    logp.requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0]], dtype=torch.float64)
    out, stats = ppo_actor_loss(logp, torch.zeros_like(logp), adv, torch.ones_like(adv))
    out.backward()
    assert logp.grad is not None
    # d(-A * r) / d logp = -A * r, over 4 tokens; clipped tokens 0 and 2 get nothing
    close(logp.grad, [[0.0, -1.1 / 4, 0.0, -0.5 / 4]])
    close(stats["clip_fraction"], 0.5)


def test_sequence_level_ratio() -> None:
    # row 0: log-ratios [.1, .3] (pad 5.0) -> mean .2; row 1: [-.2, 0] -> mean -.1
    log_ratio = torch.tensor([[0.1, 0.3, 5.0], [-0.2, 0.0, 0.0]], dtype=torch.float64)
    logp = log_ratio.clone().requires_grad_()
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    out, stats = ppo_actor_loss(logp, torch.zeros_like(logp), adv, mask, eps_clip=0.5,
                                importance_sampling_level="sequence")
    s0, s1 = math.exp(0.2), math.exp(-0.1)
    close(out, -(2 * s0 + 2 * s1) / 4)
    close(stats["importance_weight_mean"], (2 * s0 + 2 * s1) / 4)
    close(stats["importance_weight_max"], s0)
    # loss = -(2 s0 + 2 s1) / 4 and d s_i / d logp_t = s_i / 2 for each of the 2 tokens of row i
    out.backward()
    assert logp.grad is not None
    close(logp.grad, [[-s0 / 4, -s0 / 4, 0.0], [-s1 / 4, -s1 / 4, 0.0]])
    token_out, _ = ppo_actor_loss(log_ratio, torch.zeros_like(logp), adv, mask, eps_clip=0.5)
    close(token_out, -(math.exp(0.1) + math.exp(0.3) + math.exp(-0.2) + 1.0) / 4)


def test_sequence_level_ratio_is_clipped_as_a_whole() -> None:
    logp = torch.tensor([[0.1, 0.3]], dtype=torch.float64)  # sequence ratio e^.2 = 1.2214 > 1.2
    out, stats = ppo_actor_loss(logp, torch.zeros_like(logp), torch.ones_like(logp), torch.ones_like(logp),
                                importance_sampling_level="sequence")
    close(out, -1.2)
    close(stats["clip_fraction"], 1.0)


def test_decoupled_loss_with_behaviour_cap() -> None:
    # ratio 1 (logp = old_logp), behaviour weights exp(old - behav) = [1, 2, 5]; cap 3 drops the third token
    old = torch.tensor([[0.0, math.log(2.0), math.log(5.0)]], dtype=torch.float64)
    behav = torch.zeros_like(old)
    adv, mask = torch.ones_like(old), torch.ones_like(old)
    out, stats = ppo_actor_loss(old.clone(), old, adv, mask, behav_logp=behav)
    close(out, -(1.0 + 2.0 + 5.0) / 3)
    close(stats["behav_weight_mean"], 8.0 / 3)
    out, stats = ppo_actor_loss(old.clone(), old, adv, mask, behav_logp=behav, behav_imp_weight_cap=3.0)
    close(out, -(1.0 + 2.0 + 0.0) / 3)
    close(stats["behav_weight_mean"], 1.5)
    close(stats["behav_filtered_fraction"], 1.0 / 3)


def test_shape_mismatch() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="advantages"):
        ppo_actor_loss(x, x, torch.zeros(2), x)
