"""The adaptive KL controller (actor.kl_ctl_adaptive, rlkit.trainer.rl_math.kl_controller) against hand numbers, and
its statistic and coefficient through the advantages (rlkit.trainer.rl_math.advantage_batch): Ziegler et al.'s
update, coef x (1 + clip(kl / target - 1, -0.2, 0.2) x n / horizon), as verl's AdaptiveKLController."""

from __future__ import annotations

import math
from typing import Any

import pytest

from rlkit.config.schema.actor import ActorConfig, KLControlConfig
from rlkit.trainer.rl_math.advantage_batch import advantages_and_returns
from rlkit.trainer.rl_math.kl_controller import KLController, adapted_kl_coef
from rlkit.types import Sample


@pytest.mark.parametrize("kl, n, horizon, expected", [
    (0.05, 64, 100, 0.1),  # kl == target: unchanged, whatever n and horizon
    (0.055, 50, 100, 0.1 * (1 + 0.1 * 50 / 100)),  # error 0.1, inside the clip: 0.105
    (0.5, 50, 100, 0.1 * (1 + 0.2 * 50 / 100)),  # error 9 clipped to +0.2: 0.11, not 0.1 x 5.5
    (0.0, 50, 100, 0.1 * (1 - 0.2 * 50 / 100)),  # error -1 clipped to -0.2: 0.09, not 0.05
    (0.5, 100, 1000, 0.1 * 1.02),  # n / horizon scales the step: 0.2 x 0.1
    (0.5, 200, 1000, 0.1 * 1.04),  # twice the sequences, twice the step
])
def test_the_update_against_hand_numbers(kl: float, n: int, horizon: int, expected: float) -> None:
    assert adapted_kl_coef(0.1, kl, target_kl=0.05, horizon=horizon, n=n) == pytest.approx(expected, rel=1e-12)


def test_a_fixed_coefficient_never_moves_and_is_no_state() -> None:
    fixed = KLController(ActorConfig(kl_ctl=0.1))
    fixed.update(5.0, 64)
    assert fixed.value == 0.1 and fixed.state() == {} and fixed.restore({"version": 3}) == ""
    assert fixed.value == 0.1


def test_a_saved_adaptive_coefficient_resumed_without_the_controller_is_dropped_and_said() -> None:
    fixed = KLController(ActorConfig(kl_ctl=0.1))
    said = fixed.restore({"version": 3, "kl_ctl": 0.034})
    assert fixed.value == 0.1  # a checkpoint's value is the adaptive controller's only
    assert "adaptive KL coefficient 0.034 is not continued" in said and "actor.kl_ctl 0.1 from now on" in said
    assert "coefficient is not continued" in fixed.restore({"kl_ctl": "x" * 500})  # a hostile value is not echoed


def test_the_adaptive_coefficient_is_state_and_resumes_from_the_saved_value() -> None:
    actor = ActorConfig(kl_ctl=0.1, kl_ctl_adaptive=KLControlConfig(target_kl=0.05, horizon=100))
    run = KLController(actor)
    run.update(0.5, 50)
    run.update(0.5, 50)
    assert run.value == pytest.approx(0.1 * 1.1 * 1.1)
    resumed = KLController(actor)
    assert resumed.value == 0.1
    said = resumed.restore({"version": 3, **run.state()})
    assert resumed.value == run.value and "continues at 0.121" in said
    fresh = KLController(actor)  # a checkpoint of a run without the controller: the starting coefficient
    assert "no adaptive KL coefficient" in fresh.restore({"version": 3}) and fresh.value == 0.1


@pytest.mark.parametrize("saved", ["0.1", None, True, -0.1, 0, math.nan, math.inf, [0.1]])
def test_a_hostile_saved_coefficient_is_refused(saved: Any) -> None:
    control = KLController(ActorConfig(kl_ctl=0.1, kl_ctl_adaptive=KLControlConfig()))
    with pytest.raises(ValueError, match="is not a positive number"):
        control.restore({"kl_ctl": saved})
    assert control.value == 0.1


def _samples() -> list[Sample]:
    """Sample 0: 2 tokens, sample 1: 1 token; reward 1 on each (GRPO's sequence advantage)."""
    return [Sample([1], [5, 6], [-1.0, -1.0], 1.0, 0, True, 0, advantage=1.0),
            Sample([1], [7], [-1.0], 1.0, 0, True, 1, advantage=1.0)]


OLD = {0: [-1.0, -1.0], 1: [-1.0]}
REF = {0: [-1.2, -1.4], 1: [-1.6]}  # k1 = old - ref: 0.2, 0.4 | 0.6


def test_the_statistic_is_the_mean_over_sequences_of_each_sequence_s_token_mean() -> None:
    """verl's current_kl: (0.2 + 0.4) / 2 = 0.3 and 0.6, so 0.45 (the token mean would be 0.4)."""
    actor = ActorConfig(kl_ctl=0.1, kl_estimator="k1", adv_norm=None)
    stats, _ = advantages_and_returns(_samples(), OLD, REF, actor)
    assert stats["kl_seq_mean"] == pytest.approx(0.45)


def test_the_penalty_uses_the_controller_s_coefficient() -> None:
    """kl_ctl=0.5 given to the advantages overrides actor.kl_ctl 0.1: the same advantages as a config of 0.5.
    Sample 0 (discount 1): token 1: 1 - 0.5 x 0.4 = 0.8, token 0: 0.8 - 0.5 x 0.2 = 0.7."""
    actor = ActorConfig(kl_ctl=0.1, kl_estimator="k1", adv_norm=None)
    given = _samples()
    stats, _ = advantages_and_returns(given, OLD, REF, actor, kl_ctl=0.5)
    assert given[0].token_advantages == pytest.approx([0.7, 0.8])
    assert given[1].token_advantages == pytest.approx([1 - 0.5 * 0.6])
    assert stats["kl_reward"] == pytest.approx(-0.5 * (0.2 + 0.4 + 0.6) / 3)
    plain = _samples()
    advantages_and_returns(plain, OLD, REF, ActorConfig(kl_ctl=0.5, kl_estimator="k1", adv_norm=None))
    assert [s.token_advantages for s in plain] == [s.token_advantages for s in given]


def test_step_done_logs_the_coefficient_used_then_updates_for_the_next_step() -> None:
    actor = ActorConfig(kl_ctl=0.1, kl_estimator="k1", adv_norm=None,
                        kl_ctl_adaptive=KLControlConfig(target_kl=0.3, horizon=10))
    control = KLController(actor)
    stats, _ = advantages_and_returns(_samples(), OLD, REF, actor, kl_ctl=control.value)
    assert control.step_done(stats, 2) == {"kl_ctl": 0.1}
    # kl 0.45 over target 0.3: error 0.5, clipped to 0.2; 2 sequences over a horizon of 10
    assert control.value == pytest.approx(0.1 * (1 + 0.2 * 2 / 10))
    assert control.step_done({}, 2) == {} and control.value == pytest.approx(0.104)  # no penalty: no update


@pytest.mark.parametrize("kl", [math.nan, math.inf, -math.inf])
def test_a_step_whose_kl_is_not_a_number_leaves_the_coefficient_as_it_was(kl: float) -> None:
    """A step of non-finite log-probs (its optimizer step skipped for the gradient norm: the run goes on) measures a
    KL that is no number: the coefficient keeps its value, not NaN for every later step and a checkpoint that would
    not resume."""
    control = KLController(ActorConfig(kl_ctl=0.1, kl_ctl_adaptive=KLControlConfig(target_kl=0.05, horizon=100)))
    assert control.step_done({"kl_seq_mean": kl}, 50) == {"kl_ctl": 0.1}
    assert control.value == 0.1
    control.update(0.5, 50)  # a later step moves it as ever
    assert control.value == pytest.approx(0.11, rel=1e-12)
    assert KLController(ActorConfig(kl_ctl=0.1, kl_ctl_adaptive=KLControlConfig())).restore(control.state())
