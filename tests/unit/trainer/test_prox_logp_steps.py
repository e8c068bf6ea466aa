"""actor.prox_logp_method through GRPO's real step (rlkit.jobs.grpo.algorithm.GRPO.step) and a real PPOActor of the
tiny model on one gloo rank, rank 0's rollouts and weight push stubbed: loglinear skips the forward pass of the
log-probs before the update (counted at the model's first layer) and trains on the approximation; metrics trains
exactly as recompute and logs the approximation's error."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rlkit.config.schema.actor import ActorConfig, MicroBatchSpec
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.jobs.grpo.algorithm import GRPO
from rlkit.rollout.sync_schedule import SyncSchedule
from rlkit.trainer.actor import PPOActor
from rlkit.trainer.rl_math.kl_controller import KLController
from rlkit.types import Sample

STEP = 6  # the trainer's weights are version 5 (one push per step): the samples are 0 to 4 versions behind
VERSIONS = [5, 4, 3, 1]
ALPHAS = [0.0, 0.0, 1 / 2, 3 / 4]  # (5 - 1 - v) / (5 - v), clamped


class NoPush(SyncSchedule):
    """One version per step, but this test's step never pushes (there are no servers)."""

    def pushes_at(self, step: int) -> bool:
        return False


class Rank0Stub:
    """Rank 0's side of a step: hands out the batch, returns the training statistics as the step's metrics."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples, self.pushed, self.servers_gone = samples, False, ""

    def next_batch(self) -> list[Sample]:
        return self.samples

    def step_metrics(self, step: int, train_stats: dict[str, float], timing: dict[str, float]) -> dict[str, float]:
        return train_stats


def batch() -> list[Sample]:
    out = []
    for i, version in enumerate(VERSIONS):
        completion = [30 + i, 31, 32 + i, 33]
        out.append(Sample([1, 2, 3 + i], completion, [-6.0 + 0.5 * i, -5.5, -6.5, -6.0], 1.0, version, True, i,
                          advantage=1.0 if i % 2 else -1.0))
    return out


def grpo_step(model_dir: Path, **actor: Any) -> tuple[dict[str, float], list[bool], PPOActor]:
    """One GRPO step on a fresh actor; returns its metrics, whether each forward through the first layer had
    gradient on, and the actor."""
    cfg = ActorConfig(path=str(model_dir), dtype="float32", gradient_checkpointing=False, attn_impl="sdpa",
                      disable_dropout=True, logprob_chunk_tokens=16, ppo_n_minibatches=2, group_size=1,
                      mb_spec=MicroBatchSpec(max_tokens_per_mb=64), use_decoupled_loss=True, **actor)
    ppo_actor = PPOActor.build(cfg, rank=0, world=1, device=torch.device("cpu"), pad_id=0, temperature=1.0,
                               total_optimizer_steps=2)
    grads: list[bool] = []
    model: Any = ppo_actor.engine.model
    first_layer = model.model.layers[0]
    first_layer.register_forward_hook(lambda *_: grads.append(torch.is_grad_enabled()))
    grpo = GRPO.__new__(GRPO)
    grpo.config = ExperimentConfig(actor=cfg)
    grpo.actor, grpo.trainer, grpo.schedule = ppo_actor, Rank0Stub(batch()), NoPush()  # type: ignore[assignment]
    grpo.transport = SimpleNamespace(timings={})  # type: ignore[assignment]
    grpo.mismatch_t, grpo.expert, grpo.expert_batch = None, None, None
    grpo.kl_control = KLController(cfg)
    return grpo.step(STEP).metrics, grads, ppo_actor


@pytest.fixture(scope="module")
def recomputed(gloo: None, tiny_model_dir: Path) -> tuple[dict[str, float], list[bool], PPOActor]:
    """The step under prox_logp_method recompute (the default), which both tests compare with."""
    return grpo_step(tiny_model_dir)


def test_loglinear_skips_the_forward_pass_before_the_update(recomputed: Any, tiny_model_dir: Path) -> None:
    _, recompute, _ = recomputed
    metrics, loglinear, actor = grpo_step(tiny_model_dir, prox_logp_method="loglinear")
    # one forward with gradient per minibatch in both; the model's own probes of its packed attention (without
    # gradient, the same in both) and, with recompute only, the log-probs of the batch (one micro-batch)
    assert recompute.count(True) == loglinear.count(True) == 2
    assert recompute.count(False) == loglinear.count(False) + 1
    assert actor.current_version == STEP - 1
    # every sample has 4 tokens: the token mean of alpha is the mean over samples
    assert metrics["actor/loglinear_alpha"] == pytest.approx(sum(ALPHAS) / len(ALPHAS))
    assert "actor/behav_weight_mean" in metrics  # still the decoupled loss, on the approximated proximal policy


def test_metrics_trains_as_recompute_and_logs_the_approximation_error(recomputed: Any, tiny_model_dir: Path) -> None:
    plain, plain_grads, plain_actor = recomputed
    measured, measured_grads, measured_actor = grpo_step(tiny_model_dir, prox_logp_method="metrics")
    assert measured_grads == plain_grads
    assert measured["actor/loss"] == plain["actor/loss"] and measured["actor/grad_norm"] == plain["actor/grad_norm"]
    after: list[dict[str, Any]] = [dict(a.engine.model.named_parameters()) for a in (plain_actor, measured_actor)]
    for name, p in after[0].items():  # FSDP's sharded parameters, whole
        assert torch.equal(p.full_tensor(), after[1][name].full_tensor()), name
    logged = {k: v for k, v in measured.items() if k not in plain}
    assert set(logged) == {"actor/loglinear_alpha", "actor/loglinear_abs_error", "actor/loglinear_rel_error",
                           "actor/loglinear_squared_error", "actor/loglinear_behave_imp_weight_abs_error",
                           "actor/loglinear_importance_weight_abs_error", "actor/rollout_abs_error"}
    # the servers' log-probs (about -6) are far from the tiny model's (about -log 512): both approximations err
    assert logged["actor/rollout_abs_error"] > 0.1 and logged["actor/loglinear_abs_error"] > 0.01
    # loglinear moves the stale tokens toward the current policy, so it is nearer than the servers' log-probs
    assert logged["actor/loglinear_abs_error"] < logged["actor/rollout_abs_error"]
