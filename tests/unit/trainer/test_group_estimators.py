"""verl's group estimators as rlkit settings, through rlkit's own advantage code (prepare_batch, token_advantages),
against each estimator computed here from its definition in plain Python: grpo_passk (actor.passk_advantage after
reward_norm), gpg (reward_norm's group mean, then actor.gpg_scale), opo (adv_norm's token-weighted group mean), on
two groups of mixed lengths with ties, flat groups and groups of one."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from rlkit.checks.algo import validate_algorithm
from rlkit.config.problems import Problems
from rlkit.config.schema.actor import ActorConfig, NormConfig
from rlkit.trainer.rl_math.advantage_batch import prepare_batch, token_advantages
from rlkit.trainer.rl_math.group_estimators import best_only
from rlkit.types import Sample

VERL_EPS = 1e-6


def _samples(rewards: list[float], lengths: list[int], group_size: int) -> list[list[Sample]]:
    flat = [Sample(prompt_ids=[1, 2], completion_ids=[5] * n, behav_logp=[-0.1] * n, reward=r, version=0,
                   finished=True, group=i // group_size) for i, (r, n) in enumerate(zip(rewards, lengths, strict=True))]
    return [flat[i:i + group_size] for i in range(0, len(flat), group_size)]


def _groups(values: list[float], size: int) -> list[list[float]]:
    return [values[i:i + size] for i in range(0, len(values), size)]


def passk_reference(rewards: list[float], size: int, by_std: bool) -> list[float]:
    """Pass@k (arXiv 2503.19595, verl's grpo_passk): the group's best sample gets best - second best (over the
    group's unbiased std + eps), the others 0."""
    out: list[float] = []
    for g in _groups(rewards, size):
        ranked = sorted(g, reverse=True)
        margin = ranked[0] - ranked[1]
        if by_std:
            margin /= statistics.stdev(g) + VERL_EPS
        best = g.index(ranked[0])
        out += [margin if i == best else 0.0 for i in range(len(g))]
    return out


def gpg_reference(rewards: list[float], size: int) -> list[float]:
    """GPG (verl's gpg): (batch size / samples with a nonzero reward) x (reward - its group's mean)."""
    alpha = len(rewards) / max(1, sum(1 for r in rewards if r != 0))
    return [alpha * (r - sum(g) / len(g)) for g in _groups(rewards, size) for r in g]


def opo_reference(rewards: list[float], lengths: list[int], size: int) -> list[list[float]]:
    """OPO (arXiv 2505.23585, verl's opo): reward minus the group's length-weighted mean reward, on every token."""
    out: list[list[float]] = []
    for g, n in zip(_groups(rewards, size), _groups([float(x) for x in lengths], size), strict=True):
        baseline = sum(r * k for r, k in zip(g, n, strict=True)) / sum(n)
        out += [[r - baseline] * int(k) for r, k in zip(g, n, strict=True)]
    return out


CASES = [  # (rewards, lengths, group size): two groups each
    ([1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 0.25, 0.75], [3, 5, 2, 4, 6, 1, 3, 2], 4),  # ties below the top
    ([1.0, 1.0, 0.0, 0.2, 0.3, 0.9], [2, 7, 1, 4, 4, 3], 3),  # a tie at the top, then distinct
    ([0.5, 0.5, 0.5, 2.0, -1.0, 0.0], [1, 2, 3, 4, 5, 6], 3),  # a flat group, negative rewards
    ([0.0, 0.0, 0.0, 0.0], [2, 3, 4, 5], 2),  # every reward 0
]


@pytest.mark.parametrize("by_std", [True, False])
@pytest.mark.parametrize(("rewards", "lengths", "size"), CASES)
def test_passk_after_group_reward_norm_is_verl_s_grpo_passk(rewards: list[float], lengths: list[int], size: int,
                                                             by_std: bool) -> None:
    norm = NormConfig(mean_level="group", std_level="group" if by_std else None, eps=VERL_EPS)
    actor = ActorConfig(group_size=size, reward_norm=norm, passk_advantage=True)
    got = [s.advantage for s in prepare_batch(_samples(rewards, lengths, size), actor, max_new_tokens=8).samples]
    assert got == pytest.approx(passk_reference(rewards, size, by_std), rel=1e-5, abs=1e-6)
    assert sum(1 for a in got if a != 0) <= len(rewards) // size  # at most the best of each group


@pytest.mark.parametrize(("rewards", "lengths", "size"), CASES)
def test_group_mean_then_gpg_scale_is_verl_s_gpg(rewards: list[float], lengths: list[int], size: int) -> None:
    actor = ActorConfig(group_size=size, reward_norm=NormConfig(mean_level="group", std_level=None), gpg_scale=True)
    got = [s.advantage for s in prepare_batch(_samples(rewards, lengths, size), actor, max_new_tokens=8).samples]
    assert got == pytest.approx(gpg_reference(rewards, size), rel=1e-6, abs=1e-7)


@pytest.mark.parametrize(("rewards", "lengths", "size"), CASES)
def test_token_weighted_group_mean_of_the_returns_is_verl_s_opo(rewards: list[float], lengths: list[int],
                                                                 size: int) -> None:
    actor = ActorConfig(group_size=size, reward_norm=None, adv_norm=NormConfig(mean_level="group", std_level=None))
    batch = prepare_batch(_samples(rewards, lengths, size), actor, max_new_tokens=8).samples
    token_advantages(batch, None, None, actor)
    expected = opo_reference(rewards, lengths, size)
    assert [len(s.token_advantages or []) for s in batch] == lengths
    for s, row in zip(batch, expected, strict=True):
        assert s.token_advantages == pytest.approx(row, abs=1e-6)


def test_groups_of_one_are_refused_for_passk() -> None:
    """verl raises on a pass@k group of one; rlkit refuses it at submit (and the function on its own)."""
    with pytest.raises(ValueError, match="groups of 2 or more"):
        best_only(torch.tensor([1.0, 0.0]), 1)
    problems = Problems()
    validate_algorithm(ActorConfig(group_size=1, passk_advantage=True), problems)
    assert "actor.passk_advantage with groups of 1 sample" in " ".join(str(e) for e in problems.errors)
    fine = Problems()
    validate_algorithm(ActorConfig(group_size=2, passk_advantage=True), fine)
    assert fine.ok()


def test_gpg_scale_counts_the_batch_s_nonzero_rewards_after_dynamic_sampling() -> None:
    """The factor is over the batch trained on: a flat group dropped by dynamic sampling is not counted."""
    actor = ActorConfig(group_size=2, reward_norm=NormConfig(mean_level="group", std_level=None), gpg_scale=True,
                        dynamic_sampling=True)
    out = prepare_batch(_samples([1.0, 0.0, 0.0, 0.0, 1.0, 1.0], [1] * 6, 2), actor, max_new_tokens=8)
    assert out.dropped_groups == 2
    assert [s.advantage for s in out.samples] == pytest.approx([2 * 0.5, 2 * -0.5])  # 2 samples, 1 nonzero


def _grpo_step_moves_weights(model_dir: Path, rewards: list[float]) -> bool:
    """One real GRPO step (rlkit.jobs.grpo.algorithm.GRPO.step, the tiny model's PPOActor on one gloo rank, rank 0
    stubbed as in test_prox_logp_steps) on one group of `rewards` under verl's grpo_passk settings, no weight decay:
    whether any weight moved."""
    from types import SimpleNamespace

    from rlkit.config.schema.actor import MicroBatchSpec, OptimizerConfig
    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.jobs.grpo.algorithm import GRPO
    from rlkit.trainer.actor import PPOActor
    from rlkit.trainer.rl_math.kl_controller import KLController
    from tests.unit.trainer.test_prox_logp_steps import NoPush, Rank0Stub

    cfg = ActorConfig(path=str(model_dir), dtype="float32", gradient_checkpointing=False, attn_impl="sdpa",
                      disable_dropout=True, logprob_chunk_tokens=16, ppo_n_minibatches=1, group_size=len(rewards),
                      mb_spec=MicroBatchSpec(max_tokens_per_mb=64), optimizer=OptimizerConfig(weight_decay=0.0),
                      reward_norm=NormConfig(mean_level="group", std_level="group", eps=VERL_EPS),
                      passk_advantage=True)
    ppo_actor = PPOActor.build(cfg, rank=0, world=1, device=torch.device("cpu"), pad_id=0, temperature=1.0,
                               total_optimizer_steps=1)
    samples = [Sample([1, 2, 3 + i], [30 + i, 31, 32 + i, 33], [-6.0, -5.5, -6.5, -6.0], r, 0, True, 0)
               for i, r in enumerate(rewards)]
    batch = prepare_batch([samples], cfg, max_new_tokens=8).samples
    grpo = GRPO.__new__(GRPO)
    grpo.config = ExperimentConfig(actor=cfg)
    grpo.actor, grpo.trainer, grpo.schedule = ppo_actor, Rank0Stub(batch), NoPush()  # type: ignore[assignment]
    grpo.transport = SimpleNamespace(timings={})  # type: ignore[assignment]
    grpo.mismatch_t, grpo.expert, grpo.expert_batch = None, None, None
    grpo.kl_control = KLController(cfg)
    before = [p.detach().clone() for p in ppo_actor.engine.model.parameters()]
    grpo.step(1)
    return any(not torch.equal(b, p) for b, p in zip(before, ppo_actor.engine.model.parameters(), strict=True))


def test_a_real_grpo_step_learns_from_the_best_completion_only(gloo: None, tiny_model_dir: Path) -> None:
    """A group tied at the top has no pass@k signal: GRPO's step leaves the weights as they were (plain GRPO would
    move them: its advantages there are +-0.87); a group with one best completion moves them."""
    assert not _grpo_step_moves_weights(tiny_model_dir, [1.0, 1.0, 0.0, 0.0])
    assert _grpo_step_moves_weights(tiny_model_dir, [1.0, 0.5, 0.0, 0.0])
