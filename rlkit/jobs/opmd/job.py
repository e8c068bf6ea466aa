"""Job type opmd: Trinity-RFT's online policy mirror descent, on GRPO's servers, rollouts and weight sync."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.jobs.base import JobType

if TYPE_CHECKING:
    from rlkit.config.allocation import Allocation
    from rlkit.config.problems import Problems
    from rlkit.config.schema.experiment import ExperimentConfig


def _validate_opmd(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    from rlkit.checks.evaluation import validate_evaluator
    from rlkit.config.schema.rl_mix import OPMDConfig
    from rlkit.jobs.grpo.checks import validate_training  # imports the user's reward module
    from rlkit.trainer.rl_math.opmd import OPMD_BASELINES

    validate_training(config, allocation, problems)
    validate_evaluator(config, problems)
    opmd: OPMDConfig = config.opmd
    if opmd.opmd_baseline not in OPMD_BASELINES:
        problems.add(f"opmd.opmd_baseline '{opmd.opmd_baseline}' is not one of: {', '.join(OPMD_BASELINES)}",
                     hint="e.g. opmd.opmd_baseline=mean")
    if config.actor.reward_norm is not None:
        problems.add("actor.reward_norm is set, but OPMD's advantage is the reward minus its group baseline "
                     "(opmd.opmd_baseline), never divided by a std", hint="remove actor.reward_norm")
    for name in ("passk_advantage", "gpg_scale", "kl_penalty_level"):  # GRPO's sequence advantages: OPMD's replace
        if getattr(config.actor, name) not in (False, "token"):
            problems.add(f"actor.{name} is set, but OPMD's advantage is the reward minus its group baseline "
                         "(opmd.opmd_baseline)", hint=f"remove actor.{name}")
    # PPO's clip knobs (SAPO, M2PO, ...): OPMD has a loss of its own (clipped_loss false), rlkit.checks.unread_knobs
    if config.actor.group_size < 2:
        problems.add(f"actor.group_size is {config.actor.group_size}: OPMD's baseline needs a group (a group of one "
                     "has baseline 0, so its advantage is the raw reward)", hint="e.g. actor.group_size=8 and "
                     "gconfig.n_samples=8 (Trinity-RFT: repeat_times > 1)")


OPMD = JobType(
    name="opmd", help="online policy mirror descent (Trinity-RFT's opmd): group-baseline advantages, no ratio clip",
    needs_servers=True, trainer=True, resumable=True, step="rlkit.jobs.opmd.algorithm:run_opmd", trinity=("opmd",),
    sequence_parallel=True,
    sections=("actor", "opmd", "train_dataset", "valid_dataset", "reward", "gconfig", "rollout", "saver", "recover",
              "evaluator", "eval_gconfig", "expert_dataset", "mix", "sft", "reasoning_gym"),
    prompt_dataset="train_dataset", lora=True, validate=_validate_opmd, passes_on="policy", auxiliary=True,
    kl_terms=True, ppo_update=True, own_section="opmd", rows="rl",
)
