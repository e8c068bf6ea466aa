"""Job type grpo: asynchronous GRPO, inference servers generating while the FSDP trainer learns."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.jobs.base import JobType

if TYPE_CHECKING:
    from rlkit.config.allocation import Allocation
    from rlkit.config.problems import Problems
    from rlkit.config.schema.experiment import ExperimentConfig


def _validate_grpo(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    from rlkit.checks.evaluation import validate_evaluator
    from rlkit.jobs.grpo.checks import validate_training  # imports the user's reward module: grpo only

    validate_training(config, allocation, problems)
    validate_evaluator(config, problems)


GRPO = JobType(
    name="grpo", help="asynchronous GRPO training (servers generate, the trainer learns)",
    needs_servers=True, trainer=True, resumable=True, step="rlkit.jobs.grpo.algorithm:run_grpo",
    # mix: grpo plus the expert rows' SFT loss (expert_dataset, mix.mu); cispo, gspo: grpo with their policy loss
    # (rlkit.config.trinity_loss)
    trinity=("grpo", "mix", "cispo", "gspo"),
    # each as reward_norm / adv_norm / passk_advantage / gpg_scale settings (rlkit.config.verl.estimators)
    verl=("grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "grpo_passk", "opo", "gpg", "reinforce_plus_plus",
          "reinforce_plus_plus_baseline"),
    sequence_parallel=True,
    sections=("actor", "train_dataset", "valid_dataset", "reward", "gconfig", "rollout", "saver", "recover",
              "evaluator", "eval_gconfig", "expert_dataset", "mix", "sft", "reasoning_gym"),
    prompt_dataset="train_dataset", lora=True, validate=_validate_grpo, passes_on="policy", auxiliary=True,
    kl_terms=True, ppo_update=True, clipped_loss=True, rows="rl",
)
