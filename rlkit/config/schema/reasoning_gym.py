"""The `reasoning_gym` section: reasoning-gym's procedural tasks as a dataset source (`train_dataset.path:
reasoning-gym`, or `reasoning-gym:<task>` for one task). Torch-free and free of reasoning_gym itself: the login node
reads it; the rows are generated in the job (rlkit.tasks.reasoning_gym).

The field names follow reasoning-gym's own TRL example (its `datasets: {name: {weight, config}}`, `dataset_size`,
`developer_prompt`), split into flat dicts so every field keeps one help text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlkit.config.schema.fields import SEED_MAX, _f

DATASET_SOURCE = "reasoning-gym"  # train_dataset.path / valid_dataset.path naming this source


def names_reasoning_gym(path: str) -> bool:
    """Whether a dataset path names reasoning-gym (`reasoning-gym` or `reasoning-gym:<task>`) instead of a file."""
    return path == DATASET_SOURCE or path.startswith(DATASET_SOURCE + ":")


def path_task(path: str) -> str:
    """The task a `reasoning-gym:<task>` path names ("" for plain `reasoning-gym`)."""
    return path.partition(":")[2].strip()


def seed_span(seed: int, size: int, tasks: int) -> range:
    """The generator seeds a dataset's rows draw on: reasoning-gym's composite gives task j the seed seed + j + 1
    and draws row i (and its task choice) from seed + i, so rows of two spans that intersect can repeat."""
    return range(seed, seed + size + tasks + 1)


def task_weights(section: ReasoningGymConfig, path: str) -> dict[str, float]:
    """The tasks to mix and their weights: the path's one task (weight 1), else reasoning_gym.tasks."""
    task = path_task(path)
    return {task: 1.0} if task else {str(k): float(v) for k, v in section.tasks.items()}


@dataclass
class ReasoningGymConfig:
    """reasoning-gym tasks by name (train_dataset.path or valid_dataset.path `reasoning-gym`): generated in the job."""

    tasks: dict[str, float] = _f({}, "Tasks to mix, {task name: weight} (reasoning-gym's composite dataset draws each "
                                     "row's task with these weights); with train_dataset.path reasoning-gym:<task> "
                                     "leave it empty.")
    task_config: dict[str, Any] = _f({}, "Per task, the keyword arguments of its config (e.g. {basic_arithmetic: "
                                         "{min_terms: 2, max_terms: 2}}); size and seed come from this section.")
    size: int = _f(1000, "Rows generated for train_dataset.", ge=1)
    seed: int = _f(1, "Seed of train_dataset's rows.", ge=0, le=SEED_MAX)
    valid_size: int = _f(100, "Rows generated for valid_dataset, and for job type generate's dataset (path "
                              "reasoning-gym: an evaluation reads the held-out rows).", ge=1)
    valid_seed: int = _f(1_000_000, "Seed of valid_dataset's (and generate's) rows. reasoning-gym draws row i from "
                                    "seed + i, so seeds closer than the sizes share rows: refused at submit.", ge=0,
                         le=SEED_MAX)
    system_prompt: str = _f("default", "reasoning-gym's SYSTEM_PROMPTS entry sent as the system message (default, "
                                       "DeepSeekZero, simple, direct, chain_of_draft; each asks for the answer in "
                                       "<answer></answer> tags), or none: the question alone.")
