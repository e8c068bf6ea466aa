"""Job type distill: GRPO's asynchronous layout (servers sample, the FSDP trainer learns) where a teacher, served as an
auxiliary model group, scores every sampled token and the student learns the per-token reverse KL to it (optionally a
top-k forward KL, optionally plus the GRPO objective). Its own job type rather than a grpo mode: it has its own section
(`distill`), makes a reward function optional and needs an auxiliary model, which read better as a type of their own;
the algorithm itself is GRPO's with other advantages (rlkit.jobs.distill.algorithm).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.jobs.base import JobType

if TYPE_CHECKING:
    from rlkit.config.allocation import Allocation
    from rlkit.config.problems import Problems
    from rlkit.config.schema.experiment import ExperimentConfig


def _validate_distill(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    """grpo's checks (rollouts, reward, actor, the evaluator), then the teacher's and the distill section's."""
    from rlkit.checks.evaluation import validate_evaluator
    from rlkit.jobs.distill.checks import validate_distill
    from rlkit.jobs.grpo.checks import validate_training  # imports the user's reward module

    validate_training(config, allocation, problems)
    validate_evaluator(config, problems)
    validate_distill(config, problems)


DISTILL = JobType(
    name="distill", help="on-policy distillation: servers sample, a teacher server scores every token, the trainer "
                         "learns the reverse KL to the teacher",
    needs_servers=True, trainer=True, resumable=True, step="rlkit.jobs.distill.algorithm:run_distill", trinity=(),
    sections=("actor", "distill", "train_dataset", "valid_dataset", "reward", "gconfig", "rollout", "saver", "recover",
              "evaluator", "eval_gconfig", "reasoning_gym"),
    prompt_dataset="train_dataset", validate=_validate_distill, passes_on="policy", auxiliary=True, kl_terms=True,
    ppo_update=True, clipped_loss=True,
    own_section="distill",  # no `rows`: rl rows alone say grpo or ppo; the distill section says distill
    no_lora="distillation trains the full model (LoRA adapters with a teacher are not built yet)",
)
