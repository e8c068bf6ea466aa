"""The actor's entropy bonus (actor.entropy_coeff) and its passes over a batch (actor.ppo_epochs), through a real
PPOActor on the tiny Qwen2 model on one gloo rank (float32): the loss with the bonus is the clipped surrogate minus
entropy_coeff x the token-mean entropy at the sampling temperature, its gradient that of the hand-built loss; with the
coefficient 0 the loss and gradient are bit-identical to the surrogate alone; ppo_epochs=2 makes 2 x
ppo_n_minibatches optimizer steps over the same minibatches, the second pass seeing ratios away from 1; and the
learning-rate schedule of grpo's actor and ppo's critic counts every pass; the SFT+RL mix takes its expert rows in
every pass."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor

from rlkit.config.schema.actor import ActorConfig, MicroBatchSpec
from rlkit.config.schema.critic import CriticConfig
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.trainer import actor as actor_module
from rlkit.trainer.actor import PPOActor
from rlkit.trainer.batch import MicroBatch, pack
from rlkit.trainer.engine import token_logprobs
from rlkit.trainer.head_logprobs import model_token_logprobs
from rlkit.trainer.rl_math.losses import ppo_actor_loss
from rlkit.types import Sample

TEMPERATURE = 0.7
RTOL = 1e-5


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A one-process gloo group (FSDP needs one)."""
    from rlkit.servers.health import find_free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _config(model_dir: Path, **changes: Any) -> ActorConfig:
    fields: dict[str, Any] = dict(path=str(model_dir), dtype="float32", gradient_checkpointing=False,
                                  attn_impl="sdpa", disable_dropout=True, logprob_chunk_tokens=8, group_size=1,
                                  ppo_n_minibatches=1, mb_spec=MicroBatchSpec(max_tokens_per_mb=1000))
    return ActorConfig(**{**fields, **changes})


def _samples() -> list[Sample]:
    """Four samples of different lengths and advantages of both signs."""
    out = []
    for i, length in enumerate((9, 6, 11, 7)):
        completion = [(31 * i + 7 * j) % 400 + 1 for j in range(length)]
        out.append(Sample([3 + i, 5, 8], completion, [-1.0] * length, 0.0, 0, True, i, advantage=(-1.0) ** i * 0.7))
    return out


def _actor(model_dir: Path, **changes: Any) -> tuple[PPOActor, list[Sample]]:
    """The actor, and samples whose behaviour log-probs are its own (ratios start at 1: a gradient everywhere)."""
    actor = PPOActor.build(_config(model_dir, **changes), rank=0, world=1, device=torch.device("cpu"), pad_id=0,
                           temperature=TEMPERATURE, total_optimizer_steps=10)
    samples = _samples()
    for sample, logp in zip(samples, actor.compute_logprobs(samples), strict=True):
        sample.behav_logp = logp
    return actor, samples


def _recorded_step(actor: PPOActor, samples: list[Sample], monkeypatch: pytest.MonkeyPatch
                   ) -> tuple[dict[str, float], dict[str, Tensor], MicroBatch, bool]:
    """One train_step whose optimizer step is replaced by a record of every full gradient; with the micro-batch the
    loss saw (its row order) and whether the entropy it got carried gradient (a graph kept: memory)."""
    grads: dict[str, Tensor] = {}
    packed: list[MicroBatch] = []
    entropy_grad: list[bool] = []

    def logprobs(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        logp, entropy = token_logprobs(*args, **kwargs)
        assert entropy is not None
        entropy_grad.append(entropy.requires_grad)
        return logp, entropy

    def record() -> float:
        grads.update({n: p.grad.full_tensor().clone() for n, p in actor.engine.model.named_parameters()
                      if p.grad is not None})
        return 0.0

    def packing(*args: Any, **kwargs: Any) -> MicroBatch:
        packed.append(pack(*args, **kwargs))
        return packed[-1]

    monkeypatch.setattr(actor.engine, "_clip_and_step", record)
    monkeypatch.setattr(actor_module, "pack", packing)
    monkeypatch.setattr(actor_module, "token_logprobs", logprobs)
    stats = actor.train_step(samples, None, None)
    assert len(packed) == len(entropy_grad) == 1, "one micro-batch expected"
    return stats, grads, packed[0], entropy_grad[0]


def _hand_loss(actor: PPOActor, mb: MicroBatch, coeff: float, chunk: int) -> tuple[Tensor, dict[str, Tensor]]:
    """The clipped surrogate minus coeff x the token-mean entropy of logits / T, built here from the model's
    forward (the log-probs asked without any entropy; the full logits for the entropy), and every parameter's full
    gradient of it."""
    model = actor.engine.model
    model.train()
    model.zero_grad(set_to_none=True)
    logp, _ = model_token_logprobs(model, mb.input_ids, mb.attention_mask, temperature=TEMPERATURE,
                                   chunk_tokens=chunk)
    loss, _ = ppo_actor_loss(logp, mb.behav_logp, mb.advantages, mb.loss_mask)
    if coeff:
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1].float() / TEMPERATURE
        entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
        loss = loss - coeff * entropy[mb.loss_mask].mean()
    loss.backward()
    grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def test_the_entropy_bonus_is_the_hand_built_loss(one_rank: None, tiny_model_dir: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    actor, samples = _actor(tiny_model_dir, entropy_coeff=0.3)
    stats, grads, mb, entropy_grad = _recorded_step(actor, samples, monkeypatch)
    assert entropy_grad
    hand, hand_grads = _hand_loss(actor, mb, 0.3, chunk=0)
    surrogate, _ = _hand_loss(actor, mb, 0.0, chunk=0)
    assert abs(stats["actor/loss"] - float(hand)) <= RTOL * abs(float(hand))
    assert abs(float(hand - surrogate)) > 0.1  # the bonus moved the loss: 0.3 x an entropy of several nats
    assert abs(float(surrogate - hand) / 0.3 - stats["actor/entropy"]) <= 1e-4  # the metric is that entropy
    assert set(grads) == set(hand_grads)
    floor = max(float(g.abs().max()) for g in hand_grads.values())
    for name, grad in hand_grads.items():
        error = float((grads[name] - grad).abs().max())
        assert error <= RTOL * floor, f"gradient of {name} differs by {error:.3g} (largest gradient {floor:.3g})"


def test_coefficient_zero_is_the_surrogate_bit_for_bit(one_rank: None, tiny_model_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    actor, samples = _actor(tiny_model_dir)
    assert actor.config.entropy_coeff == 0.0  # the default
    stats, grads, mb, entropy_grad = _recorded_step(actor, samples, monkeypatch)
    assert not entropy_grad, "the entropy statistic kept a graph (its recompute's memory) with the bonus off"
    hand, hand_grads = _hand_loss(actor, mb, 0.0, chunk=actor.config.logprob_chunk_tokens)
    assert stats["actor/loss"] == float(hand)
    assert set(grads) == set(hand_grads) and grads
    for name, grad in hand_grads.items():
        assert torch.equal(grads[name], grad), name


def test_two_epochs_step_twice_over_the_same_minibatches(one_rank: None, tiny_model_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """ppo_epochs=2, ppo_n_minibatches=2: four optimizer steps, the minibatches of the first pass again in the same
    order (verl's: split once, not reshuffled); the first minibatch's ratios are 1 in the first pass, not in the
    second (the weights moved)."""
    actor, samples = _actor(tiny_model_dir, ppo_n_minibatches=2, ppo_epochs=2)
    actor.config.optimizer.lr = 1e-2
    seen: list[tuple[tuple[int, ...], float]] = []  # (the micro-batch's completion lengths, max |log ratio|)

    def surrogate(logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, **kwargs: Any) -> Any:
        rows = tuple(sorted(int(row.sum()) for row in mask))  # the samples' lengths differ: they name the rows
        seen.append((rows, float((logp.detach() - old)[mask].abs().max())))
        return ppo_actor_loss(logp, old, adv, mask, **kwargs)

    monkeypatch.setattr(actor_module, "ppo_actor_loss", surrogate)
    stats = actor.train_step(samples, None, None)
    assert actor.engine.optimizer_steps == 4
    assert len(seen) == 4
    assert [rows for rows, _ in seen[2:]] == [rows for rows, _ in seen[:2]]
    assert seen[0][1] < 1e-5, f"first pass, first minibatch: log ratio {seen[0][1]:.3g}, expected 0"
    assert seen[2][1] > 1e-3, f"second pass, first minibatch: log ratio {seen[2][1]:.3g}, expected the update's"
    assert stats["actor/importance_weight_max"] > 1.0 + 1e-3


@pytest.mark.parametrize(("critic_epochs", "critic_passes"), [(None, 3), (1, 1)])
def test_the_schedule_counts_every_pass(one_rank: None, tiny_model_dir: Path, tmp_path: Path,
                                        critic_epochs: int | None, critic_passes: int) -> None:
    """ppo's algorithm (grpo's with a critic) as the trainer builds it: 5 steps (10 prompts, 2 a step) of 2 actor
    minibatches x 3 passes is a schedule of 30 optimizer steps; the critic's 4 minibatches take actor.ppo_epochs
    passes unless critic.ppo_epochs says otherwise (verl's default)."""
    from rlkit.jobs.ppo.algorithm import PPO
    from rlkit.trainer.dist import DistEnv
    from rlkit.trainer.loop import LoopContext
    from rlkit.trials.paths import TrialPaths

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1="}) + "\n" for i in range(10)))
    config = ExperimentConfig(experiment_name="e", trial_name="t", type="ppo", actor=_config(
        tiny_model_dir, ppo_n_minibatches=2, ppo_epochs=3),
        critic=CriticConfig(dtype="float32", attn_impl="sdpa", ppo_n_minibatches=4, ppo_epochs=critic_epochs))
    config.train_dataset.path, config.train_dataset.batch_size, config.total_train_epochs = str(data), 2, 1
    ctx = LoopContext(config, TrialPaths(tmp_path / "trial"), DistEnv(0, 1, 0, "", 0), torch.device("cpu"))
    ppo = PPO(ctx)
    assert ppo.total_steps == 5
    assert ppo.actor.engine.total_optimizer_steps == 5 * 2 * 3
    assert ppo.critic.engine.total_optimizer_steps == 5 * 4 * critic_passes
    assert ppo.critic.config.ppo_epochs == critic_passes


def test_the_sft_mix_takes_its_expert_rows_in_every_pass(one_rank: None, tiny_model_dir: Path) -> None:
    """With expert rows (the SFT+RL mix) each of the 2 x 2 optimizer steps takes its share of them: the mix's expert
    tokens count both passes."""
    from rlkit.trainer.sft_mix import ExpertBatch

    actor, samples = _actor(tiny_model_dir, ppo_n_minibatches=2, ppo_epochs=2)
    expert = [Sample([4, 5], [7 + j for j in range(n)], [0.0] * n, 0.0, 0, True, 10 + n) for n in (3, 5)]
    stats = actor.train_step(samples, None, None, expert=ExpertBatch(expert, mu=0.3))
    assert actor.engine.optimizer_steps == 4
    assert stats["mix/expert_tokens"] == 2 * (3 + 5)
