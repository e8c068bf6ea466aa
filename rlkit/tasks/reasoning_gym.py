"""reasoning-gym's tasks as prompt rows, generated in the job (reasoning-gym is a trainer extra, never imported on
the login node).

The rows are built as reasoning-gym's own TRL example builds them: its composite dataset mixes the tasks with their
weights (seed for train_dataset, valid_seed for valid_dataset: disjoint draws), and each prompt is the chosen
SYSTEM_PROMPTS entry as a system message, then the question as the user's. Each row keeps the entry (question,
answer, metadata) and the task's name and config, which is all the reward (rlkit.rewards.reasoning_gym) needs to call
the task's own score_answer in a worker process.
"""

from __future__ import annotations

from typing import Any

from rlkit.config.schema.reasoning_gym import ReasoningGymConfig, task_weights
from rlkit.errors import StepError
from rlkit.tasks.reasoning_gym_names import NO_SYSTEM_PROMPT

TASK_KEY = "task"  # a row's task name: the reward's scorer and the per-task metrics read it
CONFIG_KEY = "task_config"


def prompt_messages(question: str, system_prompt: str) -> list[dict[str, str]]:
    """The chat of one question: reasoning-gym's system prompt `system_prompt` (by name; none: left out), then the
    question as the user turn."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    chat = [] if system_prompt == NO_SYSTEM_PROMPT else [{"role": "system", "content": SYSTEM_PROMPTS[system_prompt]}]
    return [*chat, {"role": "user", "content": question}]


def generate_rows(section: ReasoningGymConfig, path: str, *, valid: bool) -> list[dict[str, Any]]:
    """The rows of a dataset whose path names reasoning-gym: section.size rows from section.seed, or (valid)
    section.valid_size rows from section.valid_seed. StepError when reasoning-gym is missing or refuses a config."""
    try:
        import reasoning_gym
        from reasoning_gym.composite import DatasetSpec
    except ImportError as exc:
        raise StepError(f"the dataset is reasoning-gym's ({path}) but reasoning_gym cannot be imported in the job "
                        f"({exc}); install rlkit's extra: pip install 'rlkit[reasoning-gym]'") from None
    configs = {str(k): dict(v) for k, v in section.task_config.items()}
    specs = [DatasetSpec(name, weight, configs.get(name, {})) for name, weight in task_weights(section, path).items()]
    size, seed = (section.valid_size, section.valid_seed) if valid else (section.size, section.seed)
    try:
        dataset = reasoning_gym.create_dataset("composite", size=size, seed=seed, datasets=specs)
        entries = list(dataset)
    except Exception as exc:  # a task config reasoning-gym refuses (its validate() asserts)
        raise StepError(f"reasoning-gym could not generate {path} rows: {type(exc).__name__}: {exc}") from None
    return [{"prompt": prompt_messages(entry["question"], section.system_prompt), "question": entry["question"],
             "answer": entry["answer"], "metadata": entry["metadata"],
             TASK_KEY: entry["metadata"]["source_dataset"],
             CONFIG_KEY: configs.get(entry["metadata"]["source_dataset"], {})} for entry in entries]


def rows_summary(rows: list[dict[str, Any]]) -> str:
    """How many rows of each task a generated dataset holds, for the job's log: `basic_arithmetic 130, chain_sum 2`."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row[TASK_KEY]] = counts.get(row[TASK_KEY], 0) + 1
    return ", ".join(f"{task} {n}" for task, n in sorted(counts.items()))
