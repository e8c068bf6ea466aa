"""OPMD as an algorithm of the training loop: GRPO's rollouts, weight sync and metrics (rlkit.jobs.grpo), with
Trinity-RFT's advantage and loss (rlkit.trainer.rl_math.opmd): each sample's advantage is its shaped reward minus its
group's baseline (opmd.opmd_baseline at opmd.tau), the loss the mean (actor.loss_agg_mode) of -A * log pi over
1 + opmd.tau.

The KL terms (actor.kl_ctl, kl_loss_coef), adv_norm and the SFT+RL mix apply as in grpo; the clip knobs do not
(OPMD has no ratio), nor reward_norm (refused at submit).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import Tensor

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.jobs.grpo.algorithm import GRPO, set_token_advantages
from rlkit.jobs.grpo.waits import trainer_waits
from rlkit.trainer.loop import run_training
from rlkit.trainer.rl_math.opmd import opmd_advantages, opmd_policy_loss
from rlkit.types import Sample


def run_opmd(trial_dir: Path, config: ExperimentConfig) -> None:
    """The OPMD trainer step's entry point on every rank (`rlkit train --trial-dir`)."""
    run_training(trial_dir, config, OPMD, waits=trainer_waits(config))


def set_opmd_advantages(samples: list[Sample], *, group_size: int, baseline: str, tau: float) -> dict[str, float]:
    """Every sample's advantage: its shaped reward (info["shaped_reward"], before any normalisation) minus its
    group's baseline; the batch holds whole groups, group_size samples each, in order. Returns metrics."""
    rewards = torch.tensor([s.info.get("shaped_reward", s.reward) for s in samples], dtype=torch.float64)
    advantages = opmd_advantages(rewards.view(-1, group_size), baseline=baseline, tau=tau).flatten()
    for s, a in zip(samples, advantages.tolist(), strict=True):
        s.advantage = float(a)
        s.token_advantages = None
    return {"opmd/advantage_mean": float(advantages.mean()), "opmd/advantage_abs_mean": float(advantages.abs().mean()),
            "opmd/baseline_mean": float((rewards - advantages).mean())}


def _loss(tau: float, mode: str, scale: float | None, logp: Tensor, old: Tensor, advantages: Tensor, mask: Tensor
          ) -> tuple[Tensor, dict[str, Tensor]]:
    # the old policy is not used; averaged as actor.loss_agg_mode says, as the trainer weighs it
    return opmd_policy_loss(logp, advantages, mask, tau=tau, loss_agg_mode=mode, loss_scale_factor=scale)


class OPMD(GRPO):
    """GRPO with OPMD's advantages and loss."""

    def train_batch(self, samples: list[Sample], old: dict[int, list[float]] | None,
                    ref: dict[int, list[float]] | None) -> dict[str, float]:
        opmd, actor = self.config.opmd, self.actor.config
        stats = set_opmd_advantages(samples, group_size=actor.group_size, baseline=opmd.opmd_baseline, tau=opmd.tau)
        # the KL penalty, then per-token, adv_norm
        stats.update(set_token_advantages(actor, samples, old, ref, self.kl_control))
        loss = functools.partial(_loss, opmd.tau, actor.loss_agg_mode, self.actor.loss_scale_factor)
        stats.update(self.actor.train_step(samples, old, ref, policy_loss=loss, expert=self.expert_batch))
        return stats
