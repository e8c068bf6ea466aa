"""The adaptive KL controller through GRPO's real step (rlkit.jobs.grpo.algorithm.GRPO.step) and a real PPOActor of
the tiny model with its frozen reference, on one gloo rank (rank 0's rollouts and weight push stubbed, as in
test_prox_logp_steps): each step's penalty uses the controller's coefficient, logged as actor/kl_ctl, and the next
step the updated one; the coefficient is saved with the algorithm's state of a recover checkpoint, and a resumed
GRPO continues from it, not from actor.kl_ctl."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rlkit.config.schema.actor import ActorConfig, KLControlConfig, MicroBatchSpec
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import StepError
from rlkit.jobs.grpo import algorithm as grpo_algorithm
from rlkit.jobs.grpo.algorithm import GRPO, set_token_advantages
from rlkit.trainer.actor import PPOActor
from rlkit.trainer.recover import LoopState
from rlkit.trainer.rl_math.kl_controller import KLController, adapted_kl_coef
from rlkit.types import Sample
from tests.unit.trainer.test_prox_logp_steps import NoPush, Rank0Stub, batch

CONTROL = KLControlConfig(target_kl=0.05, horizon=10)


class Rank0WithState(Rank0Stub):
    def state(self, step: int) -> dict[str, Any]:
        return {"version": step, "step": step, "consumed_prefix": 0, "consumed_extra": []}


def _actor(model_dir: Path) -> PPOActor:
    """The tiny model's actor with actor.kl_ctl 0.1 adapted by CONTROL (so with its frozen reference)."""
    cfg = ActorConfig(path=str(model_dir), dtype="float32", gradient_checkpointing=False, attn_impl="sdpa",
                      disable_dropout=True, logprob_chunk_tokens=16, ppo_n_minibatches=1, group_size=1,
                      mb_spec=MicroBatchSpec(max_tokens_per_mb=64), kl_ctl=0.1, kl_estimator="k1",
                      kl_ctl_adaptive=CONTROL)
    ppo_actor = PPOActor.build(cfg, rank=0, world=1, device=torch.device("cpu"), pad_id=0, temperature=1.0,
                               total_optimizer_steps=4)
    assert ppo_actor.has_reference
    return ppo_actor


def _grpo(ppo_actor: PPOActor) -> GRPO:
    """GRPO on this rank with the pieces a step reads (no servers): a new run's, or a new attempt's of one (the
    actor's weights are not what these tests check)."""
    cfg = ppo_actor.config
    grpo = GRPO.__new__(GRPO)
    grpo.config, grpo.rank0 = ExperimentConfig(actor=cfg), True
    grpo.actor, grpo.trainer, grpo.schedule = ppo_actor, Rank0WithState(batch()), NoPush()  # type: ignore[assignment]
    grpo.transport = SimpleNamespace(timings={})  # type: ignore[assignment]
    grpo.mismatch_t, grpo.expert, grpo.expert_batch = None, None, None
    grpo.kl_control = KLController(cfg)
    return grpo


def _resume(grpo: GRPO, algorithm_state: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """GRPO.start as the loop calls it on resuming, on a rank other than 0 (rank 0 would also start its rollouts),
    without servers or a weight transport."""
    monkeypatch.setattr(grpo_algorithm, "mismatch_temperature", lambda *a, **k: None)
    monkeypatch.setattr(grpo_algorithm, "transport_for_actor",
                        lambda actor: lambda config, paths: SimpleNamespace(timings={}))
    monkeypatch.setattr(grpo_algorithm, "_check_weights", lambda *a, **k: None)
    trainer, grpo.trainer, grpo.paths, grpo.probe = grpo.trainer, None, None, []  # type: ignore[assignment]
    grpo.rank0 = False
    grpo.start(algorithm_state)
    grpo.trainer, grpo.rank0 = trainer, True


def test_each_step_uses_the_controller_s_coefficient_and_a_resumed_run_continues_it(
        gloo: None, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    actor = _actor(tiny_model_dir)
    run = _grpo(actor)
    first = run.step(1).metrics
    second = run.step(2).metrics
    n = len(batch())
    assert first["actor/kl_ctl"] == 0.1
    after_first = adapted_kl_coef(0.1, first["actor/kl_seq_mean"], target_kl=CONTROL.target_kl,
                                  horizon=CONTROL.horizon, n=n)
    assert second["actor/kl_ctl"] == pytest.approx(after_first, rel=1e-12) and after_first != 0.1
    saved_value = adapted_kl_coef(after_first, second["actor/kl_seq_mean"], target_kl=CONTROL.target_kl,
                                  horizon=CONTROL.horizon, n=n)
    assert run.kl_control.value == pytest.approx(saved_value, rel=1e-12)
    # the recover checkpoint's state, as the loop writes and reads it (JSON)
    state = LoopState.from_json(LoopState(step=2, algorithm=run.state(2)).to_json())
    assert state.algorithm["kl_ctl"] == run.kl_control.value and state.algorithm["version"] == 2
    resumed = _grpo(actor)
    _resume(resumed, state.algorithm, monkeypatch)
    assert resumed.step(3).metrics["actor/kl_ctl"] == run.kl_control.value  # not actor.kl_ctl's 0.1
    altered = _grpo(actor)
    with pytest.raises(StepError, match="kl_ctl 'lots' is not a positive number"):
        _resume(altered, {**state.algorithm, "kl_ctl": "lots"}, monkeypatch)


def test_set_token_advantages_penalises_with_the_controller_s_value(gloo: None) -> None:
    """GRPO's (and opmd's, distill's) advantages take the controller's coefficient, not actor.kl_ctl: a resumed 0.5
    with k1 estimates 0.2, 0.4 gives token rewards -0.1, 1 - 0.2, so advantages 0.7, 0.8 (0.1 would give 0.94, 0.96)."""
    actor = ActorConfig(kl_ctl=0.1, kl_estimator="k1", adv_norm=None, kl_ctl_adaptive=CONTROL)
    control = KLController(actor)
    control.restore({"kl_ctl": 0.5})
    samples = [Sample([1], [5, 6], [-1.0, -1.0], 1.0, 0, True, 0, advantage=1.0)]
    stats = set_token_advantages(actor, samples, {0: [-1.0, -1.0]}, {0: [-1.2, -1.4]}, control)
    assert samples[0].token_advantages == pytest.approx([0.7, 0.8])
    assert stats["actor/kl_ctl"] == 0.5 and stats["actor/kl_seq_mean"] == pytest.approx(0.3)
    assert control.value == pytest.approx(0.5 * (1 + 0.2 * 1 / CONTROL.horizon))  # kl 0.3 over target 0.05


def test_ppo_s_advantages_take_the_controller_s_value_and_update_it(gloo: None) -> None:
    """Job type ppo computes its advantages apart (with the critic's values): the same coefficient, the same update.
    Values 0, discount 1: the advantages are the returns, 0.7 and 0.8 under the resumed 0.5."""
    from rlkit.jobs.ppo.algorithm import PPO

    cfg = ActorConfig(kl_ctl=0.1, kl_estimator="k1", adv_norm=None, kl_ctl_adaptive=CONTROL)
    ppo = PPO.__new__(PPO)
    ppo.kl_control, ppo.expert_batch = KLController(cfg), None
    ppo.kl_control.restore({"kl_ctl": 0.5})
    ppo.actor = SimpleNamespace(config=cfg, train_step=lambda *a, **k: {})  # type: ignore[assignment]
    returns: list[list[list[float]]] = []
    ppo.critic = SimpleNamespace(  # type: ignore[assignment]
        values_at=lambda samples: {i: [0.0] * len(s.completion_ids) for i, s in enumerate(samples)},
        train_step=lambda samples, values, r: returns.append(r) or {})
    samples = [Sample([1], [5, 6], [-1.0, -1.0], 1.0, 0, True, 0, advantage=1.0)]
    stats = ppo.train_batch(samples, {0: [-1.0, -1.0]}, {0: [-1.2, -1.4]})
    assert samples[0].token_advantages == pytest.approx([0.7, 0.8]) and returns[0][0] == pytest.approx([0.7, 0.8])
    assert stats["actor/kl_ctl"] == 0.5
    assert ppo.kl_control.value == pytest.approx(0.5 * (1 + 0.2 * 1 / CONTROL.horizon))


def test_summed_into_the_sequence_the_penalty_gives_every_token_one_advantage(gloo: None) -> None:
    """actor.kl_penalty_level sequence (verl's use_kl_in_reward under its outcome estimators): the resumed 0.5 x the
    summed k1 estimates 0.2 + 0.4 comes off the sequence's reward before its advantage, 1 - 0.3 on both tokens (per
    token it was 0.7, 0.8 above); the controller reads the same KL."""
    actor = ActorConfig(kl_ctl=0.1, kl_estimator="k1", adv_norm=None, kl_ctl_adaptive=CONTROL,
                        kl_penalty_level="sequence")
    control = KLController(actor)
    control.restore({"kl_ctl": 0.5})
    samples = [Sample([1], [5, 6], [-1.0, -1.0], 1.0, 0, True, 0, advantage=1.0)]
    stats = set_token_advantages(actor, samples, {0: [-1.0, -1.0]}, {0: [-1.2, -1.4]}, control)
    assert samples[0].token_advantages == pytest.approx([0.7, 0.7]) and samples[0].advantage == pytest.approx(0.7)
    assert stats["actor/kl_ctl"] == 0.5 and stats["actor/kl_seq_mean"] == pytest.approx(0.3)
