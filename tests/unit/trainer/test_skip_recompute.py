"""The log-probs' forward left to the update's own forward (rlkit.config.schema.actor.reuses_training_logprobs)
through GRPO's real step (rlkit.jobs.grpo.algorithm.GRPO.step) and a real PPOActor of the tiny model on one gloo rank,
rank 0's rollouts and weight push stubbed: one optimizer step over the batch trains the same weights with one
forward fewer (counted at the model's first layer), with the decoupled loss, M2PO, the SFT+RL mix and opmd too, and
the mismatch check reads the training forward; every configuration whose numbers would differ (more optimizer steps,
the KL reward penalty, dropout, distill) still recomputes. "Recomputed" is the same config with the skip forced off
(PPOActor.reuses_training_logprobs = False): today's path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rlkit.config.schema.actor import ActorConfig, MicroBatchSpec, OptimizerConfig, reuses_training_logprobs
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.jobs.distill.algorithm import Distill
from rlkit.jobs.grpo.algorithm import GRPO
from rlkit.jobs.opmd.algorithm import OPMD
from rlkit.rollout.sync_schedule import SyncSchedule
from rlkit.trainer.actor import PPOActor
from rlkit.trainer.mismatch import ServerMismatch
from rlkit.trainer.rl_math.kl_controller import KLController
from rlkit.trainer.sft_mix import ExpertBatch
from rlkit.types import Sample

# the recomputed (eval mode, no grad) and the training forward (train mode, with grad) of the same micro-batches in
# float32 on the CPU: measured bit-identical (0.0); a small margin for other kernels' last bits
TOLERANCE = 1e-6


class NoPush(SyncSchedule):
    """One version per step, but this test's step never pushes (there are no servers)."""

    def pushes_at(self, step: int) -> bool:
        return False


class Rank0Stub:
    """Rank 0's side of a step: hands out the batch, keeps the mismatch check's result, returns the training
    statistics as the step's metrics."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples, self.pushed, self.servers_gone = samples, False, ""
        self.mismatch: dict[int, ServerMismatch] = {}

    def next_batch(self) -> list[Sample]:
        return self.samples

    def note_mismatch(self, per_server: dict[int, ServerMismatch], version: int) -> None:
        self.mismatch = per_server

    def step_metrics(self, step: int, train_stats: dict[str, float], timing: dict[str, float]) -> dict[str, float]:
        return train_stats


@pytest.fixture(scope="module")
def dropout_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with attention dropout 0.1 in its config.json (the tiny Qwen2's is 0.0)."""
    out = tmp_path_factory.mktemp("dropout") / "model"
    shutil.copytree(tiny_model_dir, out)
    config = json.loads((out / "config.json").read_text())
    assert config["attention_dropout"] == 0.0
    config["attention_dropout"] = 0.1
    (out / "config.json").write_text(json.dumps(config))
    return out


def batch() -> list[Sample]:
    """Four samples of version 0 from server 0 whose servers' log-probs are far from the tiny model's."""
    out = []
    for i in range(4):
        completion = [30 + i, 31, 32 + 2 * i, 33, 34][: 3 + i % 3]
        out.append(Sample([1, 2, 3 + i], completion, [-6.0 + 0.5 * i] * len(completion), 0.5 * i, 0, True, i,
                          advantage=1.0 if i % 2 else -1.0, server=0))
    return out


def _config(model_dir: Path, **actor: Any) -> ActorConfig:
    fields: dict[str, Any] = dict(path=str(model_dir), dtype="float32", gradient_checkpointing=False,
                                  attn_impl="sdpa", disable_dropout=False, logprob_chunk_tokens=16,
                                  ppo_n_minibatches=1, group_size=1, mb_spec=MicroBatchSpec(max_tokens_per_mb=20),
                                  optimizer=OptimizerConfig(lr=1e-2, warmup_steps_proportion=0.0))
    return ActorConfig(**{**fields, **actor})


def grpo_step(model_dir: Path, *, force_recompute: bool = False, mismatch_t: float | None = None,
              algorithm: type[GRPO] = GRPO, expert: ExpertBatch | None = None, **actor: Any
              ) -> tuple[dict[str, float], list[bool], PPOActor, Rank0Stub]:
    """Step 1 of GRPO on a fresh actor (`force_recompute`: today's path, the recompute forced on); returns its
    metrics, whether each forward through the first layer had gradient on, the actor and rank 0's stub."""
    cfg = _config(model_dir, **actor)
    ppo_actor = PPOActor.build(cfg, rank=0, world=1, device=torch.device("cpu"), pad_id=0, temperature=1.0,
                               total_optimizer_steps=2, ref=None)
    if force_recompute:
        ppo_actor.reuses_training_logprobs = False
    grads: list[bool] = []
    model: Any = ppo_actor.engine.model
    model.model.layers[0].register_forward_hook(lambda *_: grads.append(torch.is_grad_enabled()))
    grpo = algorithm.__new__(algorithm)
    rank0 = Rank0Stub(batch())
    grpo.config = ExperimentConfig(actor=cfg)
    grpo.actor, grpo.trainer, grpo.schedule = ppo_actor, rank0, NoPush()  # type: ignore[assignment]
    grpo.transport = SimpleNamespace(timings={})  # type: ignore[assignment]
    grpo.mismatch_t, grpo.expert_batch = mismatch_t, None
    grpo.kl_control = KLController(cfg)
    grpo.expert = SimpleNamespace(batch=lambda step: expert) if expert else None  # type: ignore[assignment]
    return grpo.step(1).metrics, grads, ppo_actor, rank0


def _before_update(grads: list[bool]) -> int:
    """The forwards without gradient before the update's first."""
    return grads.index(True) - grads[: grads.index(True)].count(True)


def _weights(actor: PPOActor) -> dict[str, torch.Tensor]:
    return {n: p.full_tensor().detach().clone() for n, p in actor.engine.model.named_parameters()}  # type: ignore


def test_the_decision_is_one_optimizer_step_without_anything_reading_the_log_probs_first() -> None:
    one = ActorConfig(ppo_n_minibatches=1)
    assert reuses_training_logprobs(one, dropout=False)
    assert not reuses_training_logprobs(ActorConfig(), dropout=False)  # the default: 4 minibatches
    for changed in (dict(ppo_epochs=2), dict(kl_ctl=0.1), dict(recompute_logprob=False),
                    dict(use_decoupled_loss=True, prox_logp_method="loglinear")):
        assert not reuses_training_logprobs(ActorConfig(ppo_n_minibatches=1, **changed), dropout=False), changed
    assert not reuses_training_logprobs(one, dropout=True)
    # what the update's forward gives as well as the recompute: the KL loss term, the decoupled loss and its metrics
    for same in (dict(kl_loss_coef=0.1), dict(use_decoupled_loss=True), dict(entropy_coeff=0.01),
                 dict(use_decoupled_loss=True, prox_logp_method="metrics", m2_threshold=0.04)):
        assert reuses_training_logprobs(ActorConfig(ppo_n_minibatches=1, **same), dropout=False), same


def test_active_dropout_is_a_dropout_module_or_a_config_probability() -> None:
    from rlkit.models.source import has_active_dropout

    assert has_active_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)))  # peft's lora_dropout
    assert not has_active_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.0)))
    model = torch.nn.Linear(2, 2)
    model.config = SimpleNamespace(model_type="qwen2", attention_dropout=0.0, hidden_size=8)  # type: ignore[assignment]
    assert not has_active_dropout(model)
    model.config.attention_dropout = 0.1  # a number the attention function reads: no module
    assert has_active_dropout(model)
    # a vision-language model's text config, nested (only a transformers config has to_dict and model_type)
    text = SimpleNamespace(model_type="qwen2", resid_pdrop=0.1, to_dict=dict)
    model.config = SimpleNamespace(model_type="vlm", attention_dropout=0.0, text_config=text)  # type: ignore[assignment]
    assert has_active_dropout(model)


def test_distill_reads_the_log_probs_before_the_update_so_never_skips() -> None:
    for cls, skips in ((GRPO, True), (Distill, False)):
        algorithm = cls.__new__(cls)
        algorithm.actor = SimpleNamespace(reuses_training_logprobs=True)  # type: ignore[assignment]
        assert algorithm.skips_recompute() is skips


Step = tuple[dict[str, float], list[bool], PPOActor, Rank0Stub]


@pytest.fixture(scope="module")
def plain(gloo: None, tiny_model_dir: Path) -> tuple[Step, Step]:
    """The step skipped and recomputed, the mismatch check on at the sampling temperature (the default's case)."""
    return grpo_step(tiny_model_dir, mismatch_t=1.0), grpo_step(tiny_model_dir, mismatch_t=1.0, force_recompute=True)


def _same_step(skipped_step: Step, recomputed_step: Step, *, forward: int = 2, ratio: bool = True) -> None:
    """The skipped step trained the recomputed one's weights and logged its metrics, with one forward fewer."""
    skipped, skipped_grads, skipped_actor, _ = skipped_step
    recomputed, recomputed_grads, recomputed_actor, _ = recomputed_step
    assert skipped_actor.reuses_training_logprobs and skipped_actor.training_logp is not None
    # the update's forwards with gradient, one per micro-batch (27 tokens, at most 20 a micro-batch: 2); the
    # recompute's as many without, before them, only when recomputed (the packed-attention probes: the same in both)
    assert skipped_grads.count(True) == recomputed_grads.count(True) == forward
    assert recomputed_grads.count(False) == skipped_grads.count(False) + 2
    assert _before_update(recomputed_grads) == _before_update(skipped_grads) + 2
    want, got = _weights(recomputed_actor), _weights(skipped_actor)
    assert max(float((got[n] - p).abs().max()) for n, p in want.items()) <= TOLERANCE
    assert recomputed["actor/grad_norm"] > 0
    assert set(skipped) == set(recomputed)
    for key in recomputed:  # every metric of today, with today's values (ratio 1: no clipping either way)
        assert skipped[key] == pytest.approx(recomputed[key], rel=1e-5, abs=1e-6), key
    if ratio:  # the clipped surrogate's (opmd's loss has none)
        assert skipped["actor/importance_weight_mean"] == 1.0 and skipped["actor/clip_fraction"] == 0.0


def test_one_optimizer_step_skips_the_forward_and_trains_the_same_weights(plain: tuple[Step, Step]) -> None:
    _same_step(*plain)


def test_the_decoupled_loss_skips_with_the_same_weights_and_behaviour_weights(gloo: None,
                                                                              tiny_model_dir: Path) -> None:
    extra: dict[str, Any] = dict(use_decoupled_loss=True, prox_logp_method="metrics", m2_threshold=0.04)
    skipped = grpo_step(tiny_model_dir, **extra)
    _same_step(skipped, grpo_step(tiny_model_dir, force_recompute=True, **extra))
    metrics = skipped[0]
    # the servers' log-probs (-6 and so on) are far from the tiny model's: the behaviour weights and M2PO see it
    assert metrics["actor/behav_weight_mean"] != pytest.approx(1.0, abs=0.1)
    assert metrics["actor/rollout_abs_error"] > 0.1 and metrics["actor/m2po_masked_fraction"] > 0


@pytest.mark.parametrize("case", ["SFT+RL mix", "opmd"])
def test_the_mix_and_opmd_skip_with_the_same_weights(gloo: None, tiny_model_dir: Path, case: str) -> None:
    """The mix's expert micro-batches share the one optimizer step; opmd's loss never reads the old log-probs."""
    rows = [Sample([1, 2], [40 + i, 41, 42], [0.0] * 3, 0.0, 0, True, i) for i in range(2)]
    kwargs: dict[str, Any] = (dict(expert=ExpertBatch(rows, mu=0.3)) if case == "SFT+RL mix" else
                              dict(algorithm=OPMD, group_size=2))
    skipped = grpo_step(tiny_model_dir, **kwargs)
    recomputed = grpo_step(tiny_model_dir, force_recompute=True, **kwargs)
    # the mix's expert rows: one more micro-batch (with gradient) in the same optimizer step
    _same_step(skipped, recomputed, forward=3 if case == "SFT+RL mix" else 2, ratio=case != "opmd")
    assert ("mix/sft_loss" in skipped[0]) is (case == "SFT+RL mix") and ("opmd/baseline_mean" in skipped[0]) is (
        case == "opmd")


def test_the_mismatch_check_reads_the_training_forward(plain: tuple[Step, Step], tiny_model_dir: Path) -> None:
    (_, _, _, skipped), (_, recomputed_grads, _, recomputed) = plain
    # the check ran no forward of its own either (the counts: test_one_optimizer_step_skips_...)
    assert skipped.mismatch.keys() == recomputed.mismatch.keys() == {0}
    got, want = skipped.mismatch[0], recomputed.mismatch[0]
    assert got.tokens == want.tokens == sum(len(s.completion_ids) for s in batch())
    assert got.mean == pytest.approx(want.mean, abs=TOLERANCE) and got.max == pytest.approx(want.max, abs=TOLERANCE)
    assert got.mean > 0.1  # the servers' log-probs are not the tiny model's
    # at another temperature than the sampling one the check runs its own forward before the update, as today
    _, other_grads, other_actor, other = grpo_step(tiny_model_dir, mismatch_t=0.7)
    assert other_actor.training_logp is not None
    assert _before_update(other_grads) == _before_update(recomputed_grads) and other.mismatch[0].tokens == got.tokens


@pytest.mark.parametrize("case", ["two minibatches", "two epochs", "kl_ctl", "dropout"])
def test_what_the_update_forward_cannot_give_still_recomputes(plain: tuple[Step, Step], tiny_model_dir: Path,
                                                              dropout_model_dir: Path, case: str) -> None:
    changes: dict[str, Any] = {"two minibatches": dict(ppo_n_minibatches=2), "two epochs": dict(ppo_epochs=2),
                               "kl_ctl": dict(kl_ctl=0.1), "dropout": {}}[case]
    model_dir = dropout_model_dir if case == "dropout" else tiny_model_dir
    _, grads, actor, _ = grpo_step(model_dir, **changes)
    assert not actor.reuses_training_logprobs and actor.training_logp is None
    # the recompute's two forwards without gradient before the update, as the recomputed step's
    assert _before_update(grads) == _before_update(plain[1][1]) == _before_update(plain[0][1]) + 2


def test_disable_dropout_makes_the_dropout_model_skip(plain: tuple[Step, Step], dropout_model_dir: Path) -> None:
    _, grads, actor, _ = grpo_step(dropout_model_dir, disable_dropout=True)
    assert actor.reuses_training_logprobs
    assert _before_update(grads) == _before_update(plain[0][1])
