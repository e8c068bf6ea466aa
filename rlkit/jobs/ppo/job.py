"""Job type ppo: GRPO's asynchronous layout (servers generate, the FSDP trainer learns) with a critic trained beside
the actor; advantages by GAE over the critic's values (actor.discount, actor.gae_lambda).

A group may be a single completion (actor.group_size 1): the critic, not the group, gives the baseline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.jobs.base import JobType

if TYPE_CHECKING:
    from rlkit.config.allocation import Allocation
    from rlkit.config.problems import Problems
    from rlkit.config.schema.experiment import ExperimentConfig


def _validate_ppo(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    """grpo's checks (rollouts, reward, actor: discount and gae_lambda in [0, 1], adv_norm levels, the evaluator:
    ppo runs GRPO's), the critic's."""
    from rlkit.checks.evaluation import validate_evaluator
    from rlkit.jobs.grpo.checks import validate_training  # imports the user's reward module
    from rlkit.jobs.pairs.checks import validate_critic

    validate_training(config, allocation, problems)
    validate_critic(config, problems)
    validate_evaluator(config, problems)
    if config.actor.kl_penalty_level == "sequence" and config.actor.kl_ctl > 0:
        problems.add("actor.kl_penalty_level sequence sums the KL penalty into each sequence's reward, but ppo's GAE "
                     "reads a reward per token from its critic's values on (verl's GAE too)",
                     hint="remove actor.kl_penalty_level (token: the penalty on each token's reward)")
    ranks = allocation.trainer.dp if allocation is not None and allocation.trainer is not None else 1
    sequences = config.train_dataset.batch_size * max(1, config.actor.group_size)
    n_mb = config.critic.ppo_n_minibatches
    if n_mb >= 1 and sequences < ranks * n_mb:
        problems.add(f"{sequences} sequences per step are fewer than {ranks} trainer ranks x "
                     f"critic.ppo_n_minibatches={n_mb}: some ranks would have nothing to train the critic on",
                     hint="raise train_dataset.batch_size or lower critic.ppo_n_minibatches")


PPO = JobType(
    name="ppo", help="asynchronous PPO with a critic (servers generate, the trainer learns the actor and its critic)",
    needs_servers=True, trainer=True, resumable=True, step="rlkit.jobs.ppo.algorithm:run_ppo", trinity=("ppo",),
    verl=("gae",),
    sections=("actor", "critic", "train_dataset", "valid_dataset", "reward", "gconfig", "rollout", "saver", "recover",
              "evaluator", "eval_gconfig", "expert_dataset", "mix", "sft", "reasoning_gym"),
    prompt_dataset="train_dataset", lora=True, validate=_validate_ppo, passes_on="policy", auxiliary=True,
    kl_terms=True, ppo_update=True, clipped_loss=True, own_section="critic", rows="rl", sequence_parallel=True,
)
