"""Submit-time checks of reasoning-gym as a dataset source (`train_dataset.path`/`valid_dataset.path`, job type
generate's `generate.dataset.path`: `reasoning-gym[:<task>]`, the `reasoning_gym` section, reward.fn `reasoning_gym`).

Torch-free and without reasoning-gym: task and system-prompt names are checked against the names of the version
rlkit pins (rlkit.tasks.reasoning_gym_names), so a typo is refused with the nearest names before anything is queued.
A task's own config keys are checked by reasoning-gym itself when the job generates the rows.
"""

from __future__ import annotations

import difflib

from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import DatasetConfig, ExperimentConfig
from rlkit.config.schema.reasoning_gym import (
    DATASET_SOURCE,
    names_reasoning_gym,
    path_task,
    seed_span,
    task_weights,
)
from rlkit.tasks.reasoning_gym_names import COMPOSITE, NO_SYSTEM_PROMPT, SYSTEM_PROMPTS, TASKS, VERSION

REWARD = "reasoning_gym"  # the built-in reward that scores these rows (rlkit.rewards.reasoning_gym)
_SECTION_KEYS = ("size", "seed")  # set by the reasoning_gym section, not per task


Datasets = tuple[tuple[str, DatasetConfig], ...]  # (field, section) of the datasets a job type reads rows from


def training_datasets(config: ExperimentConfig) -> Datasets:
    """train_dataset (the rows the reward scores) and valid_dataset: what the trainers read."""
    return ("train_dataset", config.train_dataset), ("valid_dataset", config.valid_dataset)


def uses_reasoning_gym(config: ExperimentConfig) -> bool:
    """Whether train_dataset or valid_dataset is generated from reasoning-gym."""
    return any(names_reasoning_gym(ds.path) for _, ds in training_datasets(config))


def _unknown_task(field: str, name: str) -> tuple[str, str]:
    """The problem of an unknown task name and its fix: the nearest names, else every task."""
    near = difflib.get_close_matches(name, TASKS, n=3, cutoff=0.6)
    tasks = [t for t in TASKS if t != COMPOSITE]
    hint = (f"did you mean {' or '.join(near)}?" if near
            else f"choose among reasoning-gym {VERSION}'s {len(tasks)} tasks: {', '.join(tasks)}")
    return f"{field}: '{name}' is not a reasoning-gym task", hint


def _check_task_names(field: str, names: list[str], problems: Problems) -> None:
    for name in names:
        if name == COMPOSITE:
            problems.add(f"{field}: 'composite' is reasoning-gym's mixer, not a task",
                         hint="list the tasks to mix in reasoning_gym.tasks, {task: weight}")
        elif name not in TASKS:
            message, hint = _unknown_task(field, name)
            problems.add(message, hint=hint)


def validate_reasoning_gym(config: ExperimentConfig, problems: Problems, datasets: Datasets | None = None, *,
                           scores: bool = True) -> None:
    """Add every problem of reasoning-gym's dataset source and reward to `problems`. `datasets`: the ones the job
    type reads, the first scored by the reward (default: training_datasets; generate: its prompts); `scores`:
    whether the reward is called at all."""
    section = config.reasoning_gym
    fields = datasets or training_datasets(config)
    paths = {name: ds.path for name, ds in fields if names_reasoning_gym(ds.path)}
    fns = list(config.reward.fns) or [config.reward.fn]
    scored, scored_ds = fields[0]  # the rows the reward scores: train_dataset's, or generate's prompts
    if REWARD in fns and scores and scored not in paths:
        problems.add(f"reward.fn {REWARD} scores rows generated from reasoning-gym, but {scored}.path is "
                     f"'{scored_ds.path}'",
                     hint=f"set {scored}.path={DATASET_SOURCE}:<task> (or {DATASET_SOURCE} with "
                          "reasoning_gym.tasks), or choose another reward")
    if not paths:
        if section.tasks or section.task_config:
            problems.add("reasoning_gym.tasks/task_config are set but no dataset path is reasoning-gym",
                         hint=f"set {scored}.path={DATASET_SOURCE}, or remove the reasoning_gym section")
        return
    for field, path in paths.items():
        task = path_task(path)
        if task:
            _check_task_names(f"{field}.path", [task], problems)
        if task and section.tasks:
            problems.add(f"{field}.path {path} names one task and reasoning_gym.tasks lists others",
                         hint=f"use {field}.path={DATASET_SOURCE} to mix reasoning_gym.tasks, or remove them")
        elif not task and not section.tasks:
            problems.add(f"{field}.path is {DATASET_SOURCE} but reasoning_gym.tasks is empty",
                         hint=f"list tasks as reasoning_gym.tasks={{basic_arithmetic: 1}}, or set "
                              f"{field}.path={DATASET_SOURCE}:basic_arithmetic")
    _check_task_names("reasoning_gym.tasks", [str(k) for k in section.tasks], problems)
    for name, weight in section.tasks.items():
        if weight <= 0:  # NaN and infinity: refused by rlkit.config.ranges.check_finite, named once
            problems.add(f"reasoning_gym.tasks['{name}'] has weight {weight}: a task's weight must be positive",
                         hint="e.g. 1.0, or remove the task")
    _validate_task_config(config, [*{t for p in paths.values() for t in task_weights(section, p)}], problems)
    if section.system_prompt != NO_SYSTEM_PROMPT and section.system_prompt not in SYSTEM_PROMPTS:
        problems.add(f"reasoning_gym.system_prompt '{section.system_prompt}' is not one of reasoning-gym's",
                     hint=f"choose one of {', '.join((*SYSTEM_PROMPTS, NO_SYSTEM_PROMPT))}")
    if len(paths) == 2:
        _check_held_out(config, problems)
    if "train_dataset" in paths and section.size < config.train_dataset.batch_size:
        problems.add(f"reasoning_gym.size {section.size} is smaller than train_dataset.batch_size "
                     f"{config.train_dataset.batch_size}: not one training step",
                     hint=f"set reasoning_gym.size to at least {config.train_dataset.batch_size}")


def _check_held_out(config: ExperimentConfig, problems: Problems) -> None:
    """valid_dataset's rows are none of train_dataset's: their seed spans do not meet (reasoning-gym's row i of seed
    s is row i + 1 of seed s - 1)."""
    section = config.reasoning_gym
    train = seed_span(section.seed, section.size, len(task_weights(section, config.train_dataset.path)))
    valid = seed_span(section.valid_seed, section.valid_size, len(task_weights(section, config.valid_dataset.path)))
    if train.start < valid.stop and valid.start < train.stop:
        problems.add(f"reasoning_gym.valid_seed {section.valid_seed} is within {len(train)} of seed {section.seed}: "
                     "reasoning-gym draws row i from seed + i, so valid_dataset would repeat training rows",
                     hint=f"set reasoning_gym.valid_seed to at least {train.stop} (the default is 1000000)")


def _validate_task_config(config: ExperimentConfig, tasks: list[str], problems: Problems) -> None:
    """reasoning_gym.task_config names only mixed tasks, each with a mapping without size or seed."""
    for name, settings in config.reasoning_gym.task_config.items():
        field = f"reasoning_gym.task_config['{name}']"
        if name not in tasks:
            problems.add(f"{field}: '{name}' is not among the tasks trained on ({', '.join(tasks) or 'none'})",
                         hint="key task_config by the task names of the dataset path or reasoning_gym.tasks")
        if not hasattr(settings, "keys"):
            problems.add(f"{field} must be a mapping of the task's config fields, got {settings!r}",
                         hint="e.g. {min_terms: 2, max_terms: 2}")
            continue
        fixed = sorted(k for k in _SECTION_KEYS if k in settings)
        if fixed:
            problems.add(f"{field} sets {', '.join(fixed)}, which the reasoning_gym section sets for every task",
                         hint="use reasoning_gym.size/seed (valid_size/valid_seed for valid_dataset)")
