"""From scored rollout groups to training samples with advantages, in AReaL's order (pure).

Two stages, because the KL reward penalty needs the old and reference log-probs, which the trainer ranks compute
after the batch is chosen:
1. `prepare_batch` (rank 0, sequence level): dynamic sampling, then overlong penalty on the raw reward, bias,
   scaling, clip and `reward_norm`, then the pass@k advantage and GPG's correction when asked
   (rlkit.trainer.rl_math.group_estimators). Each sample's `advantage` is its normalised sequence reward.
2. `token_advantages` (every rank, on the whole batch): token rewards (-kl_ctl * KL(old || ref) per token, the
   sequence reward on the last token), discounted returns / GAE (`discount`, `gae_lambda`), then `adv_norm` over
   tokens. Each sample gets `token_advantages`.
With `actor.kl_penalty_level: sequence` (verl's use_kl_in_reward under its outcome estimators) the penalty is summed
over each sequence's sampled tokens and subtracted from its shaped reward instead, and the sequence advantage
(reward_norm and the rest of stage 1's) is computed from that in stage 2, where the KL is known.
Multi-turn episodes: every token statistic above is over sampled tokens only (`Sample.loss_mask`): the tokens rlkit
inserted get no KL penalty, no reward, advantage 0, and take no part in adv_norm; GAE skips them
(rlkit.trainer.rl_math.gae). `actor.mask_no_eos_with_zero` leaves unfinished samples out of the actor's advantages
only: a critic's returns (its targets) are GAE over every sampled token, since the critic trains on those tokens
unless its own flag drops them (AReaL's returns are never masked by the actor's flag either). An episode's length
(DAPO's overlong penalty) is its number of sampled tokens, what the model wrote. Reference: AReaL
areal/trainer/ppo/actor.py `_compute_advantages` at 4aef98d8.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from rlkit.config.schema.actor import ActorConfig, NormConfig
from rlkit.trainer.rl_math.advantages import overlong_penalty, shape_rewards
from rlkit.trainer.rl_math.gae import gae_advantages, token_rewards
from rlkit.trainer.rl_math.group_estimators import best_only, nonzero_scale
from rlkit.trainer.rl_math.kl import kl_estimate
from rlkit.trainer.rl_math.normalization import normalize
from rlkit.trainer.sampled_tokens import check_sample, sampled_count, sampled_mask
from rlkit.types import Sample


@dataclass
class PreparedBatch:
    samples: list[Sample]
    dropped_groups: int  # dynamic sampling: groups with identical rewards carry no signal
    raw_rewards: list[float]


def apply_norm(x: torch.Tensor, norm: NormConfig | None, actor: ActorConfig,
               mask: torch.Tensor | None = None) -> torch.Tensor:
    """`normalize` with a NormConfig (None: unchanged); its group_size defaults to actor.group_size."""
    if norm is None:
        return x.float() if mask is None else (x * mask).float()
    return normalize(x, mask, mean_level=norm.mean_level, std_level=norm.std_level,
                     group_size=norm.group_size or actor.group_size, mean_leave1out=norm.mean_leave1out,
                     std_unbiased=norm.std_unbiased, eps=norm.eps)


def prepare_batch(groups: Sequence[Sequence[Sample]], actor: ActorConfig, *, max_new_tokens: int) -> PreparedBatch:
    """Check every sample (this is where a batch enters the trainer: the one check of its per-token lists, which
    every later stage relies on), drop flat groups (dynamic_sampling), then shape and normalise the sequence rewards
    (AReaL's order)."""
    for i, s in enumerate(s for g in groups for s in g):
        check_sample(s, i)
    raw = [s.reward for g in groups for s in g]
    kept = [list(g) for g in groups]
    dropped = 0
    if actor.dynamic_sampling:
        kept = [g for g in kept if len({s.reward for s in g}) > 1]
        dropped = len(groups) - len(kept)
    samples = [s for g in kept for s in g]
    if not samples:
        return PreparedBatch([], dropped, raw)
    sizes = {len(g) for g in kept}
    if sizes != {actor.group_size}:
        raise ValueError(f"groups of sizes {sorted(sizes)}, expected actor.group_size={actor.group_size}")
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    if actor.overlong_reward_penalty and actor.overlong_tokens and actor.overlong_penalty_factor is not None:
        lengths = torch.tensor([sampled_count(s) for s in samples])  # an episode's length: its sampled tokens
        rewards = overlong_penalty(rewards, lengths, max_new_tokens=max_new_tokens,
                                   overlong_tokens=actor.overlong_tokens,
                                   overlong_penalty_factor=actor.overlong_penalty_factor)
    rewards = shape_rewards(rewards, reward_scaling=actor.reward_scaling, reward_bias=actor.reward_bias,
                            reward_clip=actor.reward_clip)
    # with the penalty in the sequence reward the advantage needs the KL (known on the trainer ranks, later):
    # token_advantages normalises then
    normed = rewards if kl_in_sequence(actor) else sequence_advantages(rewards, actor)
    for s, a, r in zip(samples, normed.tolist(), rewards.tolist(), strict=True):
        s.advantage = float(a)
        s.token_advantages = None
        s.info["shaped_reward"] = float(r)
    return PreparedBatch(samples, dropped, raw)


def kl_in_sequence(actor: ActorConfig) -> bool:
    """Whether the KL reward penalty is summed into each sequence's reward before its advantage (verl's
    use_kl_in_reward under its outcome estimators), not added per token after it."""
    return actor.kl_penalty_level == "sequence" and actor.kl_ctl > 0


def sequence_advantages(rewards: torch.Tensor, actor: ActorConfig) -> torch.Tensor:
    """The sequence advantages of shaped sequence rewards (groups of actor.group_size consecutive samples):
    reward_norm, then the pass@k advantage and GPG's correction when asked (rlkit.trainer.rl_math.group_estimators)."""
    normed = apply_norm(rewards, actor.reward_norm, actor)
    if actor.passk_advantage:
        normed = best_only(normed, actor.group_size)
    if actor.gpg_scale:
        normed = normed * nonzero_scale(rewards)
    return normed


def _padded(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(list(row), dtype=torch.float64)
    return out


def _actor_mask(samples: Sequence[Sample], sampled: torch.Tensor, actor: ActorConfig) -> torch.Tensor:
    """The tokens the actor's advantages cover: the sampled ones, less unfinished samples under
    mask_no_eos_with_zero (rlkit's reading: those are left out of the actor's loss altogether)."""
    if not actor.mask_no_eos_with_zero:
        return sampled
    return sampled & torch.tensor([s.finished for s in samples])[:, None]


def _gae(seq: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None, values: torch.Tensor | None,
         actor: ActorConfig, kl_ctl: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) of GAE over the tokens in `mask`: the sequence reward on each row's last one, the KL
    penalty (coefficient `kl_ctl`) on every one. A row with no token in `mask` gets zeros."""
    rewards = token_rewards(seq, mask, kl, kl_ctl=kl_ctl)
    return gae_advantages(rewards, mask, discount=actor.discount, gae_lambda=actor.gae_lambda, values=values)


def token_advantages(samples: Sequence[Sample], old_logp: Mapping[int, Sequence[float]] | None,
                     ref_logp: Mapping[int, Sequence[float]] | None, actor: ActorConfig,
                     kl_ctl: float | None = None) -> dict[str, float]:
    """Set every sample's `token_advantages` without a critic (GRPO); returns the statistics of
    `advantages_and_returns`."""
    return advantages_and_returns(samples, old_logp, ref_logp, actor, kl_ctl=kl_ctl)[0]


def advantages_and_returns(samples: Sequence[Sample], old_logp: Mapping[int, Sequence[float]] | None,
                           ref_logp: Mapping[int, Sequence[float]] | None, actor: ActorConfig,
                           values: Mapping[int, Sequence[float]] | None = None, *, kl_ctl: float | None = None
                           ) -> tuple[dict[str, float], list[list[float]]]:
    """Set every sample's `token_advantages` from its sequence reward (`advantage`, from prepare_batch); pure.
    Also returns each sample's per-token returns (advantages before adv_norm plus values: a critic's targets).

    `values` (PPO) maps a sample's index to a critic's value of the state before each completion token; GAE then
    bootstraps from them (AReaL's order: the values are taken before the advantages, the returns are A + V).

    The samples were checked where they entered the trainer (`prepare_batch`).

    `old_logp`/`ref_logp` map a sample's index in `samples` to its completion log-probs (old: the recomputed ones,
    None for the servers' behaviour log-probs, which AReaL also uses under the decoupled loss; ref: needed when
    kl_ctl > 0). `kl_ctl`: the penalty's coefficient this step (the adaptive controller's, rlkit.trainer.rl_math.
    kl_controller); None: actor.kl_ctl. Identical on every rank given the same inputs. Returns statistics (mean KL
    reward per token, how many KL estimates the clamp bounded, and `kl_seq_mean`: each sequence's mean KL estimate
    over its sampled tokens, averaged over the sequences, what the adaptive controller reads, as verl's).
    """
    if not samples:
        return {}, []
    width = max(1, max(len(s.completion_ids) for s in samples))
    lengths = torch.tensor([len(s.completion_ids) for s in samples])
    sampled = _padded([sampled_mask(s) for s in samples], width).bool()  # inserted tokens and padding: False
    mask = _actor_mask(samples, sampled, actor)
    seq = torch.tensor([s.advantage for s in samples], dtype=torch.float64)
    kl = None
    stats: dict[str, float] = {}
    coef = actor.kl_ctl if kl_ctl is None else kl_ctl
    if actor.kl_ctl > 0:
        if ref_logp is None:
            raise ValueError("kl_ctl > 0 needs the reference log-probs")
        # AReaL: the penalty is on the recomputed log-probs, but on the behaviour ones under the decoupled loss.
        use_old = old_logp is not None and not actor.use_decoupled_loss
        old = _padded([old_logp[i] if use_old else s.behav_logp for i, s in enumerate(samples)], width)  # type: ignore[index]
        ref = _padded([ref_logp[i] for i in range(len(samples))], width)
        kl, clamped = kl_estimate(old, ref, actor.kl_estimator, clamp=actor.kl_clamp)
        kl = torch.where(sampled, kl, 0.0)  # an inserted token's behaviour log-prob is no log-prob: no penalty there
        n_tok = max(1, int(mask.sum()))
        stats["kl_reward"] = float(-(coef * kl * mask).sum()) / n_tok
        stats["kl_reward_clamped_tokens"] = float((clamped & mask).sum())
        per_seq = (kl * sampled).sum(dim=1) / sampled.sum(dim=1).clamp(min=1)
        stats["kl_seq_mean"] = float(per_seq.mean())
    if kl is not None and kl_in_sequence(actor):  # verl's order: the summed penalty, then the sequence advantage
        if values is not None:
            raise ValueError("actor.kl_penalty_level sequence has no per-token rewards for a critic's GAE")
        seq = sequence_advantages(seq - coef * (kl * sampled).sum(dim=1), actor)
        for s, a in zip(samples, seq.tolist(), strict=True):
            s.advantage = float(a)
        kl = None  # in the sequence's advantage now, not on its tokens
    v = _padded([values[i] for i in range(len(samples))], width) if values is not None else None
    adv, returns = _gae(seq, mask, kl, v, actor, coef)
    if not torch.equal(mask, sampled):  # the critic's targets: over every sampled token, not the actor's mask
        returns = _gae(seq, sampled, kl, v, actor, coef)[1]
    adv = apply_norm(adv, actor.adv_norm, actor, mask.to(adv.dtype))
    for s, row, n in zip(samples, adv.tolist(), lengths.tolist(), strict=True):
        s.token_advantages = [float(a) for a in row[:n]]
    return stats, [[float(r) for r in row[:n]] for row, n in zip(returns.tolist(), lengths.tolist(), strict=True)]
