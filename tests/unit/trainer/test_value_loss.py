"""The clipped PPO value loss: each clip case worked out by hand, masking, and the clip fraction."""

from __future__ import annotations

import pytest
import torch

from rlkit.trainer.rl_math.value_loss import ppo_value_loss


def one_token(value: float, old: float, ret: float, eps: float) -> tuple[float, float, float]:
    """Loss, clip fraction and d loss / d value for a single token."""
    v = torch.tensor([value], requires_grad=True)
    loss, stats = ppo_value_loss(v, torch.tensor([old]), torch.tensor([ret]), torch.tensor([True]), eps_clip=eps)
    loss.backward()
    assert v.grad is not None
    return loss.item(), stats["clip_fraction"].item(), v.grad.item()


def test_inside_the_clip_range_the_loss_is_plain_squared_error() -> None:
    loss, clipped, grad = one_token(0.1, 0.0, 1.0, 0.2)
    assert (loss, clipped) == (pytest.approx(0.5 * 0.9**2), 0.0)
    assert grad == pytest.approx(0.1 - 1.0)


def test_moving_past_the_clip_towards_the_return_stops_the_pull() -> None:
    # v moved from 0 to 1 towards R = 2; clipped v = 0.2 is further from R, so its (larger) loss counts, constant in v
    loss, clipped, grad = one_token(1.0, 0.0, 2.0, 0.2)
    assert loss == pytest.approx(0.5 * 1.8**2)
    assert clipped == 1.0
    assert grad == 0.0


def test_moving_past_the_clip_away_from_the_return_still_pulls_back() -> None:
    # v moved from 0 to 1 away from R = -1: the unclipped loss is the larger one and pulls v back
    loss, clipped, grad = one_token(1.0, 0.0, -1.0, 0.2)
    assert loss == pytest.approx(0.5 * 2.0**2)
    assert clipped == 0.0
    assert grad == pytest.approx(2.0)


def test_token_mean_over_the_mask_only() -> None:
    values = torch.tensor([[0.0, 1.0, 100.0], [2.0, 0.0, 0.0]])
    returns = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    loss, stats = ppo_value_loss(values, values.clone(), returns, mask, eps_clip=0.5)  # old = new: nothing clips
    assert loss.item() == pytest.approx((0.5 * 1 + 0.0 + 0.5 * 4) / 3)
    assert stats["tokens"].item() == 3 and stats["clip_fraction"].item() == 0.0
    assert stats["value"].item() == pytest.approx(1.0) and stats["return"].item() == pytest.approx(2 / 3)
    summed, summed_stats = ppo_value_loss(values, values.clone(), returns, mask, eps_clip=0.5, reduction="sum")
    assert summed.item() == pytest.approx(0.5 + 2.0) and summed_stats["loss"].item() == pytest.approx(loss.item())


def test_clip_fraction_counts_masked_tokens_only() -> None:
    old = torch.zeros(4)
    values = torch.tensor([1.0, 1.0, 0.1, 1.0])
    returns = torch.tensor([2.0, 2.0, 1.0, 2.0])  # tokens 0, 1, 3 clip
    mask = torch.tensor([True, True, True, False])
    _, stats = ppo_value_loss(values, old, returns, mask, eps_clip=0.2)
    assert stats["clip_fraction"].item() == pytest.approx(2 / 3)


def test_no_token_gives_zero_and_a_usable_graph() -> None:
    v = torch.ones(3, requires_grad=True)
    loss, _ = ppo_value_loss(v, torch.zeros(3), torch.zeros(3), torch.zeros(3, dtype=torch.bool), eps_clip=0.2)
    loss.backward()
    assert loss.item() == 0.0 and v.grad is not None and v.grad.abs().sum().item() == 0.0


def test_mismatched_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        ppo_value_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3, dtype=torch.bool),
                       eps_clip=0.2)


def test_the_critic_engine_takes_the_critics_own_settings() -> None:
    """critic.* (model, dtype, optimizer, batching, masking of truncated completions) decide the critic's engine;
    the actor's LoRA and masking do not leak into it."""
    from rlkit.config.schema.actor import ActorConfig
    from rlkit.config.schema.critic import CriticConfig
    from rlkit.jobs.ppo.critic import critic_engine_config

    actor = ActorConfig(path="/m/actor", use_lora=True, mask_no_eos_with_zero=True, ppo_n_minibatches=4)
    critic = CriticConfig(dtype="float32", ppo_n_minibatches=2)
    engine = critic_engine_config(critic, actor)
    assert (engine.path, engine.dtype, engine.ppo_n_minibatches) == ("/m/actor", "float32", 2)
    assert engine.use_lora is False and engine.mask_no_eos_with_zero is False
    critic.mask_no_eos_with_zero, critic.path = True, "/m/critic"
    assert critic_engine_config(critic, ActorConfig(path="/m/actor")).mask_no_eos_with_zero is True
    assert critic_engine_config(critic, actor).path == "/m/critic"
