"""GAE with a critic's values (job type ppo) against a hand computation on a tiny batch."""

from __future__ import annotations

import pytest

from rlkit.config.schema.actor import ActorConfig
from rlkit.trainer.rl_math.advantage_batch import advantages_and_returns, token_advantages
from rlkit.types import Sample


def _sample(n_tokens: int, reward: float) -> Sample:
    return Sample([1, 2], list(range(3, 3 + n_tokens)), [-1.0] * n_tokens, reward, 0, True, 0, advantage=reward)


def test_gae_over_critic_values_matches_a_hand_computation() -> None:
    """discount 0.9, lambda 0.8 (so discount x lambda = 0.72), reward on the last token, no adv_norm.
    Sample 0 (values 0.5, 0.2, -0.1; reward 1):
      t2: delta = 1 - (-0.1) = 1.1                       A2 = 1.1
      t1: delta = 0 + 0.9 x (-0.1) - 0.2 = -0.29         A1 = -0.29 + 0.72 x 1.1 = 0.502
      t0: delta = 0 + 0.9 x 0.2 - 0.5 = -0.32            A0 = -0.32 + 0.72 x 0.502 = 0.04144
      returns A + V: 0.54144, 0.702, 1.0
    Sample 1 (value 0.3, reward -0.5): A = -0.5 - 0.3 = -0.8, return -0.5."""
    actor = ActorConfig(discount=0.9, gae_lambda=0.8, adv_norm=None)
    samples = [_sample(3, 1.0), _sample(1, -0.5)]
    stats, returns = advantages_and_returns(samples, None, None, actor, {0: [0.5, 0.2, -0.1], 1: [0.3]})
    assert samples[0].token_advantages == pytest.approx([0.04144, 0.502, 1.1], abs=1e-6)
    assert samples[1].token_advantages == pytest.approx([-0.8], abs=1e-6)
    assert returns[0] == pytest.approx([0.54144, 0.702, 1.0], abs=1e-6)
    assert returns[1] == pytest.approx([-0.5], abs=1e-6)
    assert stats == {}  # no KL reward penalty


def test_without_values_gae_is_grpo_s_discounted_return() -> None:
    """No critic (GRPO): the same call with values None gives token_advantages' result, returns = advantages."""
    actor = ActorConfig(discount=0.9, gae_lambda=0.8, adv_norm=None)
    plain = [_sample(3, 1.0)]
    token_advantages(plain, None, None, actor)
    again = [_sample(3, 1.0)]
    _, returns = advantages_and_returns(again, None, None, actor)
    assert plain[0].token_advantages == again[0].token_advantages == pytest.approx([0.72**2, 0.72, 1.0])
    assert returns[0] == pytest.approx(again[0].token_advantages, abs=1e-6)  # V = 0: returns are the advantages


def test_the_actor_s_no_eos_mask_leaves_the_critic_s_targets_alone() -> None:
    """actor.mask_no_eos_with_zero drops the unfinished sample from the actor's advantages (all 0), but the critic
    still trains on its tokens (critic.mask_no_eos_with_zero false), so its returns are GAE over them as if the
    actor had no mask: sample 1 (no EOS; values 0.1, 0.4; reward 0.5; discount 0.9, lambda 0.8):
      t1: delta = 0.5 - 0.4 = 0.1                          A1 = 0.1,   return 0.5
      t0: delta = 0.9 x 0.4 - 0.1 = 0.26                   A0 = 0.26 + 0.72 x 0.1 = 0.332, return 0.432
    (before the fix both returns were 0: the critic learned value 0 there)."""
    actor = ActorConfig(discount=0.9, gae_lambda=0.8, adv_norm=None, mask_no_eos_with_zero=True)
    values = {0: [0.5, 0.2, -0.1], 1: [0.1, 0.4]}
    truncated = _sample(2, 0.5)
    truncated.finished = False
    samples = [_sample(3, 1.0), truncated]
    _, returns = advantages_and_returns(samples, None, None, actor, values)
    assert samples[1].token_advantages == [0.0, 0.0]  # the actor's mask: left out of the actor's loss
    assert samples[0].token_advantages == pytest.approx([0.04144, 0.502, 1.1], abs=1e-6)  # finished: unchanged
    assert returns[1] == pytest.approx([0.432, 0.5], abs=1e-6)
    unmasked = [_sample(3, 1.0), _sample(2, 0.5)]
    _, expected = advantages_and_returns(unmasked, None, None, ActorConfig(discount=0.9, gae_lambda=0.8,
                                                                           adv_norm=None), values)
    assert [r for row in returns for r in row] == pytest.approx([r for row in expected for r in row], abs=1e-12)
