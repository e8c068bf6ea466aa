"""Multi-turn samples in the trainer: the tokens rlkit inserted (loss_mask 0: tool results, template glue) count
for nothing.

Each test plants wild values (huge, infinite, NaN) where only inserted tokens could read them, or compares an episode
with the same episode whose inserted tokens were cut out: packing, the policy loss and its gradient (every loss
form), the KL penalty, GAE with a critic's values, adv_norm, DAPO's overlong length, the log-prob mismatch check and
the length metrics must come out the same.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlkit.config.schema.actor import ActorConfig, MicroBatchSpec, NormConfig, RejectionSamplingConfig
from rlkit.jobs.grpo.rank0 import _rollout_metrics
from rlkit.rollout.controller import Group
from rlkit.rollout.groups import Prompt
from rlkit.trainer.batch import pack
from rlkit.trainer.engine import token_logprobs
from rlkit.trainer.mismatch import compared_indices, measure
from rlkit.trainer.rl_math.advantage_batch import advantages_and_returns, prepare_batch
from rlkit.trainer.rl_math.losses import ppo_actor_loss
from rlkit.trainer.sample_forward import group_of, minibatch_steps
from rlkit.types import Sample

PAD = 0
WILD = [1e4, -math.inf, math.nan, -1e4]  # behaviour log-probs / advantages only an inserted token could carry

# completion of EPISODE: sampled [10, 11], inserted [20, 21, 22] (a tool result), sampled [12, 13, 14], inserted [23]
MASK = [1, 1, 0, 0, 0, 1, 1, 1, 0]


def episode(*, completion: list[int] | None = None, mask: list[int] | None = MASK, behav: list[float] | None = None,
            advantage: float = 0.5, finished: bool = True, group: int = 0, version: int = 3) -> Sample:
    completion = completion or [10, 11, 20, 21, 22, 12, 13, 14, 23]
    n = len(completion)
    if behav is None:
        behav = [-0.5 - 0.1 * j if mask is None or mask[j] else 0.0 for j in range(n)]
    versions = None if mask is None else [version if m else -1 for m in mask]
    return Sample([1, 2, 3], completion, behav, 1.0, version, finished, group, advantage=advantage, server=0,
                  loss_mask=mask, token_versions=versions)


def wild(sample: Sample) -> Sample:
    """The same sample with wild behaviour log-probs and advantages on its inserted tokens."""
    mask = mask_of(sample)
    behav = [b if m else WILD[j % len(WILD)] for j, (b, m) in enumerate(zip(sample.behav_logp, mask, strict=True))]
    adv = [sample.advantage if m else 1e6 for m in mask]
    return dataclasses.replace(sample, behav_logp=behav, token_advantages=adv)


def cut(sample: Sample) -> Sample:
    """The episode as if its inserted tokens were not there (a single-turn sample of its sampled tokens)."""
    keep = [j for j, m in enumerate(mask_of(sample)) if m]
    return dataclasses.replace(sample, completion_ids=[sample.completion_ids[j] for j in keep],
                               behav_logp=[sample.behav_logp[j] for j in keep], loss_mask=None, token_versions=None,
                               token_advantages=None)


# --- pack ---------------------------------------------------------------------------------------------------------

def test_pack_trains_only_the_sampled_tokens() -> None:
    mb = pack([episode(), wild(episode())], PAD)
    # prompt of 3: completion token j at position 2 + j
    expected = [False, False] + [bool(m) for m in MASK]
    assert mb.loss_mask[0].tolist() == expected and mb.loss_mask[1].tolist() == expected
    assert mb.n_tokens == 2 * sum(MASK)
    inserted = [2 + j for j, m in enumerate(MASK) if not m]
    for row in (0, 1):  # an inserted token's behaviour log-prob and advantage are 0 whatever the sample said
        assert mb.behav_logp[row, inserted].tolist() == [0.0] * len(inserted)
        assert mb.advantages[row, inserted].tolist() == [0.0] * len(inserted)
    torch.testing.assert_close(mb.behav_logp[0], mb.behav_logp[1])
    torch.testing.assert_close(mb.advantages[0], mb.advantages[1])
    assert mb.input_ids[0, 3:].tolist() == episode().completion_ids  # inserted tokens are in the model's context


def test_truncation_and_dummies_stay_per_sample() -> None:
    truncated = episode(finished=False)
    assert pack([truncated], PAD).n_tokens == sum(MASK)
    assert pack([truncated], PAD, mask_truncated=True).n_tokens == 0
    assert pack([dataclasses.replace(episode(), dummy=True)], PAD).n_tokens == 0


@pytest.mark.parametrize(("change", "message"), [
    ({"loss_mask": [1, 0, 1]}, "sample 1: 3 loss-mask entries for 9 tokens"),
    ({"loss_mask": [1, 2, 0, 0, 0, 1, 1, 1, -1]}, "loss mask entries must be 0 or 1, got -1, 2"),
    ({"loss_mask": [1, [1], 0, 0, 0, 1, 1, 1, 0]}, r"loss mask entries must be 0 or 1, got \[1\]"),
    ({"token_versions": [3]}, "sample 1: 1 token versions for 9 tokens"),
    ({"behav_logp": [0.0]}, "sample 1: 1 log-probs for 9 tokens"),
])
def test_misaligned_per_token_lists_are_refused_naming_the_sample(change: dict[str, Any], message: str) -> None:
    """Where the batch enters the trainer (prepare_batch): every later stage (pack, GAE, the mismatch check) relies
    on it and checks no more."""
    bad = dataclasses.replace(episode(group=7), **change)
    with pytest.raises(ValueError, match=message) as info:
        prepare_batch([[episode(), bad]], ActorConfig(group_size=2), max_new_tokens=64)
    assert "group 7" in str(info.value)


# --- the policy loss and its gradient -----------------------------------------------------------------------------

class TinyLM(nn.Module):
    """A real (if small) causal LM: each position's logits come from the mean embedding of its prefix."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(32, 8)
        self.head = nn.Linear(8, 32)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, use_cache: bool = False) -> SimpleNamespace:
        h = self.embed(input_ids) * attention_mask[..., None]
        prefix_mean = h.cumsum(1) / torch.arange(1, input_ids.shape[1] + 1)[None, :, None]
        return SimpleNamespace(logits=self.head(torch.tanh(prefix_mean)))


LOSSES: dict[str, dict[str, Any]] = {
    "token": {},
    "gspo": {"importance_sampling_level": "sequence"},
    "dual-clip": {"c_clip": 3.0},
    "decoupled-token-mask": {"decoupled": True, "rejection_sampling": RejectionSamplingConfig(upper=1.5)},
    "decoupled-seq-max-kl": {"decoupled": True, "importance_sampling_level": "sequence",
                             "rejection_sampling": RejectionSamplingConfig(level="sequence", metric="kl_k3",
                                                                           agg="max", upper=0.4)},
    "decoupled-seq-clamp": {"decoupled": True, "rejection_sampling": RejectionSamplingConfig(
        level="sequence", action="clamp", agg="mean", upper=1.1, lower=0.9)},
}


def _loss_and_grads(samples: list[Sample], plant: bool, opts: dict[str, Any]) -> tuple[Tensor, list[Tensor]]:
    """ppo_actor_loss over packed `samples` with a perturbed model as the current policy; `plant`: wild behaviour
    and old log-probs and advantages written straight into the packed tensors at the inserted positions (as if
    pack had not zeroed them), so the loss itself must ignore them."""
    opts = dict(opts)
    decoupled = opts.pop("decoupled", False)
    model = TinyLM()
    mb = pack(samples, PAD)
    with torch.no_grad():
        old, _ = token_logprobs(model, mb, 1.0)
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    behav, adv = mb.behav_logp.clone(), mb.advantages.clone()
    behav[mb.loss_mask] = old[mb.loss_mask] - 0.3 * torch.arange(int(mb.loss_mask.sum())) / 10
    real = mb.attention_mask[:, 1:].bool()
    if plant:
        inserted = real & ~mb.loss_mask
        values = torch.tensor(WILD * 10)[: int(inserted.sum())]
        behav[inserted], old[inserted], adv[inserted] = values, values.flip(0), 1e6
    logp, _ = token_logprobs(model, mb, 1.0)
    loss, _ = ppo_actor_loss(logp, behav if not decoupled else old, adv, mb.loss_mask,
                             behav_logp=behav if decoupled else None, **opts)
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]  # type: ignore[union-attr]


@pytest.mark.parametrize("opts", LOSSES.values(), ids=LOSSES.keys())
def test_inserted_tokens_change_neither_the_loss_nor_its_gradient(opts: dict[str, Any]) -> None:
    samples = [episode(advantage=1.0), episode(advantage=-1.0, mask=[1, 0, 0, 1, 1, 1, 0, 0, 1]),
               episode(mask=None, advantage=0.7)]
    clean_loss, clean_grads = _loss_and_grads(samples, False, opts)
    wild_loss, wild_grads = _loss_and_grads(samples, True, opts)
    assert clean_loss.isfinite() and float(clean_loss) != 0.0
    assert any(float(g.abs().max()) > 0 for g in clean_grads)
    torch.testing.assert_close(wild_loss, clean_loss, rtol=0, atol=0)
    for w, c in zip(wild_grads, clean_grads, strict=True):
        torch.testing.assert_close(w, c, rtol=0, atol=0)


# --- the loss denominator ---------------------------------------------------------------------------------------

@pytest.fixture
def one_rank() -> Iterator[None]:
    """A real one-process gloo group (minibatch_steps agrees on micro-batch counts through it)."""
    from rlkit.servers.health import find_free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class CountingEngine:
    """Stands in for TrainEngine.optimizer_step's bookkeeping: what minibatch_steps says it will weigh the loss by
    (`local_units`, the loss denominator) next to what its micro-batches' losses report."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, int]] = []

    def optimizer_step(self, micro_batches: Iterable[list[int]], loss_fn: Any, local_units: float) -> dict[str, float]:
        units = sum(loss_fn(None, mb)[1] for mb in micro_batches)
        self.steps.append((local_units, units))
        return {"grad_norm": 0.0, "lr": 0.0}


@pytest.mark.parametrize("mask_truncated", [False, True])
def test_the_loss_denominator_counts_the_sampled_tokens(one_rank: None, mask_truncated: bool) -> None:
    samples = [episode(), episode(mask=None), episode(finished=False, mask=[0, 1, 1, 1, 0, 1, 1, 1, 0]),
               episode(mask=[1, 0, 0, 1, 1, 1, 0, 0, 1])]

    def loss_fn(model: Any, group_idx: list[int]) -> tuple[Tensor, int]:
        return torch.zeros(()), pack(group_of(samples, group_idx), PAD, mask_truncated=mask_truncated).n_tokens

    engine = CountingEngine()
    minibatch_steps(engine, samples, [[0, 1], [2, 3]], MicroBatchSpec(max_tokens_per_mb=16), loss_fn,  # type: ignore[arg-type]
                    mask_truncated=mask_truncated)
    assert engine.steps == [(5 + 9, 14), (0 + 5, 5) if mask_truncated else (6 + 5, 11)]


# --- advantages: KL penalty, GAE, adv_norm, overlong --------------------------------------------------------------

def _batch() -> list[Sample]:
    return [episode(advantage=1.0), episode(advantage=-0.5, mask=[1, 0, 0, 1, 1, 1, 0, 0, 1]),
            episode(mask=None, advantage=0.25), episode(advantage=-1.5, mask=[0, 1, 1, 1, 0, 1, 1, 0, 0])]


def _per_token(samples: list[Sample], base: float) -> dict[int, list[float]]:
    return {i: [base + 0.01 * (i + 1) * j for j in range(len(s.completion_ids))] for i, s in enumerate(samples)}


def mask_of(s: Sample) -> list[int]:
    return s.loss_mask if s.loss_mask is not None else [1] * len(s.completion_ids)


def _kept(values: dict[int, list[float]], samples: list[Sample]) -> dict[int, list[float]]:
    return {i: [v for v, m in zip(values[i], mask_of(s), strict=True) if m] for i, s in enumerate(samples)}


@pytest.mark.parametrize("critic", [False, True], ids=["grpo", "ppo-critic"])
def test_advantages_of_an_episode_are_those_of_its_sampled_tokens_alone(critic: bool) -> None:
    """KL penalty on the behaviour log-probs (decoupled), GAE with discount and lambda < 1 and a critic's values,
    batch adv_norm: the episode's sampled tokens get exactly what the cut sample (inserted tokens removed) gets, its
    inserted tokens advantage and return 0, whatever wild behaviour log-probs or values they carry."""
    actor = ActorConfig(group_size=4, kl_ctl=0.2, use_decoupled_loss=True, discount=0.9, gae_lambda=0.8,
                        adv_norm=NormConfig(mean_level="batch", std_level="batch"))
    samples = [wild(s) for s in _batch()]
    ref = _per_token(samples, -1.0)
    values = _per_token(samples, 0.3) if critic else None
    if values is not None:  # a critic's value at an inserted token is never used
        for i, s in enumerate(samples):
            values[i] = [v if m else 1e9 for v, m in zip(values[i], mask_of(s), strict=True)]
    stats, returns = advantages_and_returns(samples, None, ref, actor, values)
    short = [cut(s) for s in _batch()]
    short_stats, short_returns = advantages_and_returns(short, None, _kept(ref, samples), actor,
                                                        _kept(values, samples) if values is not None else None)
    assert stats == pytest.approx(short_stats, rel=1e-6) and stats["kl_reward"] != 0
    for s, r, c, cr in zip(samples, returns, short, short_returns, strict=True):
        mask = mask_of(s)
        assert s.token_advantages is not None and c.token_advantages is not None
        assert [a for a, m in zip(s.token_advantages, mask, strict=True) if m] == pytest.approx(c.token_advantages)
        assert [a for a, m in zip(s.token_advantages, mask, strict=True) if not m] == [0.0] * mask.count(0)
        assert [x for x, m in zip(r, mask, strict=True) if m] == pytest.approx(cr)
        assert [x for x, m in zip(r, mask, strict=True) if not m] == [0.0] * mask.count(0)
    # the sequence reward sits on the last sampled token even when the episode ends with inserted ones
    first = samples[0].token_advantages
    assert first is not None and max(abs(a) for a in first) > 0


def test_the_reward_lands_on_the_last_sampled_token() -> None:
    # no critic, no KL, no adv_norm: A_t = discount^(sampled tokens after t) * R, inserted tokens skipped
    actor = ActorConfig(group_size=1, discount=0.5, adv_norm=None)
    (s,) = samples = [episode(advantage=8.0)]
    advantages_and_returns(samples, None, None, actor)
    assert s.token_advantages == [0.5, 1.0, 0.0, 0.0, 0.0, 2.0, 4.0, 8.0, 0.0]


def test_an_episodes_overlong_length_is_its_sampled_tokens() -> None:
    """DAPO's penalty (max_new_tokens 10, the last 4 penalised): 5 sampled tokens among 25 are not overlong."""
    actor = ActorConfig(group_size=2, reward_norm=None, overlong_reward_penalty=True, overlong_tokens=4,
                        overlong_penalty_factor=1.0)
    long_episode = episode(completion=[10] * 5 + [20] * 20, mask=[1] * 5 + [0] * 20)
    long_single = episode(completion=[10] * 25, mask=None)
    out = prepare_batch([[long_episode, long_single]], actor, max_new_tokens=10)
    assert [s.info["shaped_reward"] for s in out.samples] == [1.0, 0.0]


# --- the log-prob mismatch check and the length metrics -----------------------------------------------------------

def test_mismatch_compares_only_tokens_the_server_sampled_at_the_trainers_version() -> None:
    """A huge planted difference on an inserted token and a moderate one on a turn sampled before the last weight
    update (version 2) are not counted; the turn sampled at version 3 is, token by token."""
    s = episode(completion=[10, 11, 20, 21, 12, 13], mask=[1, 1, 0, 0, 1, 1], behav=[-1.0, -1.0, 0.0, 0.0, -2.0, -2.0])
    s.token_versions = [2, 2, -1, -1, 3, 3]
    trainer = {0: [-1.5, -1.5, -80.0, -90.0, -2.0, -2.25]}
    (part,) = measure([s], trainer, 3).values()
    assert (part.tokens, part.abs_sum, part.max) == (2, pytest.approx(0.25), pytest.approx(0.25))
    (older,) = measure([s], trainer, 2).values()
    assert (older.tokens, older.abs_sum) == (2, pytest.approx(1.0))
    assert compared_indices([s], 3) == [0] and compared_indices([s], 4) == []
    single = episode(mask=None, completion=[10, 11], behav=[-1.0, -1.0])
    assert compared_indices([single], 3) == [0] and measure([single], {0: [-1.0, -3.0]}, 3)[0].tokens == 2


def test_length_metrics_count_sampled_tokens_and_inserted_ones_apart() -> None:
    prompt = Prompt(0, {}, "q", [1, 2, 3])
    turns = Group(prompt, [episode(), episode(mask=None)], version=0, server=0, seconds=1.0)
    metrics = _rollout_metrics([turns], 0, [1.0, 1.0])
    assert metrics["response_length/mean"] == (sum(MASK) + 9) / 2 and metrics["response_length/max"] == 9
    assert metrics["response_length/inserted_mean"] == MASK.count(0) / 2
    single = Group(prompt, [episode(mask=None)], version=0, server=0, seconds=1.0)
    assert "response_length/inserted_mean" not in _rollout_metrics([single], 0, [1.0])
