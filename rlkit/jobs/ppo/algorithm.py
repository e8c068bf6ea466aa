"""PPO with a critic as an algorithm of the training loop: GRPO's algorithm (rollouts, actor, weight sync) plus a value
model trained beside the actor; `run_ppo` is the `rlkit train` step of job type ppo.

Only the batch's training differs from GRPO (`train_batch`): the critic's values of every completion token (each rank
its share, then gathered) -> GAE over them (actor.discount, actor.gae_lambda) -> the actor's PPO steps on the
advantages -> the critic's clipped value-loss steps on the returns. The critic is the loop's engine "critic": recover
checkpoints hold and resume it with the actor; the saver exports the actor only.
"""

from __future__ import annotations

from pathlib import Path

from rlkit.config.schema.actor import optimizer_steps_per_step
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.jobs.grpo.algorithm import GRPO
from rlkit.jobs.grpo.waits import trainer_waits
from rlkit.jobs.ppo.critic import PPOCritic, batch_means, critic_engine_config
from rlkit.trainer.dist import gather_per_sample
from rlkit.trainer.loop import LoopContext, run_training
from rlkit.trainer.rl_math.advantage_batch import advantages_and_returns
from rlkit.types import Sample


def run_ppo(trial_dir: Path, config: ExperimentConfig) -> None:
    """The PPO trainer step's entry point on every rank (`rlkit train --trial-dir`)."""
    run_training(trial_dir, config, PPO, waits=trainer_waits(config))


class PPO(GRPO):
    """GRPO's algorithm with a critic (engines "actor" and "critic")."""

    def __init__(self, ctx: LoopContext) -> None:
        """Collective: GRPO's set-up, then the critic's engine."""
        super().__init__(ctx)
        config = self.config
        self.critic = PPOCritic.build(config.critic, config.actor, rank=ctx.env.rank, world=ctx.env.world_size,
                                      device=ctx.device, pad_id=self.actor.pad_id,
                                      total_optimizer_steps=self.total_steps * optimizer_steps_per_step(
                                          critic_engine_config(config.critic, config.actor)))
        self.engines["critic"] = self.critic.engine

    def train_batch(self, samples: list[Sample], old: dict[int, list[float]] | None,
                    ref: dict[int, list[float]] | None) -> dict[str, float]:
        """Collective: values (before any update), advantages and returns, the actor's then the critic's steps."""
        values = gather_per_sample(self.critic.values_at(samples))
        assert values is not None
        kl_reward = self.actor.config.kl_ctl > 0
        adv_stats, returns = advantages_and_returns(samples, gather_per_sample(old) if kl_reward else None,
                                                    gather_per_sample(ref) if kl_reward else None, self.actor.config,
                                                    values, kl_ctl=self.kl_control.value)
        adv_stats.update(self.kl_control.step_done(adv_stats, len(samples)))  # then the next step's coefficient
        stats = self.actor.train_step(samples, old, ref, expert=self.expert_batch)
        stats.update({f"actor/{k}": v for k, v in adv_stats.items()})
        stats.update(self.critic.train_step(samples, values, returns))
        stats.update(batch_means(samples, values, returns))
        return stats
