"""The reward model of a multi-stage run (rlkit.launch.stages): an rw stage's checkpoints/final becomes
`reward.reward_model_path` of the later stages that score with `reward_model` (reward.fn, or a key of reward.fns)
and do not name their own, as a policy stage's final becomes actor.path. A ppo stage that gets it and leaves
critic.path unset starts its critic from it too (InstructGPT's recipe, and OpenRLHF's default: --critic_pretrain
falls back to --reward_pretrain). A stage that needs a reward model no earlier stage trains, and names none, is
refused.

Pure: the caller says which keys the stage sets itself; nothing here reads the site's files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlkit.checks.reward_model import FIELD
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.served_models import scores_with_reward_model
from rlkit.jobs.base import JobType


@dataclass(frozen=True)
class TrainedRewardModel:
    """An earlier rw stage's model: where it will be, and the model its checks read until then (the one rw trains
    from)."""

    final: str
    stand_in: str


def hand_over_reward_model(name: str, config: ExperimentConfig, job: JobType | None,
                           trained: TrainedRewardModel | None, sets: Callable[[str, str], bool],
                           problems: Problems) -> str | None:
    """Give stage `name` the reward model `trained` where it needs one; returns the stand-in its checks read ("" for
    none), None when the stage is refused (the problem is in `problems`). `sets(section, field)`: whether the stage
    itself sets the key (its mapping or its own overrides; the top level's value is replaced, as actor.path's)."""
    from rlkit.rewards.model_reward import REWARD_MODEL  # the name only (torch is imported where it scores)

    reward = config.reward
    if job is None or "reward" not in job.sections or not scores_with_reward_model(reward):
        return ""
    if trained is not None and reward.reward_model_path == trained.final:
        return trained.stand_in  # the stage names the rw stage's final itself: checked as the handed-over one
    if trained is None or sets("reward", "reward_model_path"):
        if reward.reward_model_path:
            return ""
        where = "reward.fns" if reward.fns else "reward.fn"
        problems.add(f"stage {name} scores with {REWARD_MODEL} ({where}), but {FIELD} is empty and no stage before it "
                     "trains a reward model",
                     hint=f"add an rw stage before {name} (its checkpoints/final is handed over), or set "
                          f"stages.{name}.{FIELD} to an rw trial's checkpoints/final")
        return None
    reward.reward_model_path = trained.final
    if "critic" in job.sections and not sets("critic", "path"):
        config.critic.path = trained.final
    return trained.stand_in
