"""Job type generate: complete a dataset's prompts on inference servers, from one GPU-less client step; with
generate.score, score every completion with the reward section and summarise (an evaluation of a checkpoint)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from rlkit.checks.site_files import check_dataset_file
from rlkit.config.schema.reasoning_gym import names_reasoning_gym
from rlkit.errors import ConfigError
from rlkit.jobs.base import JobType
from rlkit.trials.paths import ATTEMPT_DIR, RESERVED_NAMES

if TYPE_CHECKING:
    from rlkit.config.allocation import Allocation
    from rlkit.config.problems import Problems
    from rlkit.config.schema.experiment import ExperimentConfig


def _validate_generate(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    from rlkit.checks.reasoning_gym import validate_reasoning_gym

    dataset = config.generate.dataset.path
    if not dataset:
        problems.add("generate.dataset.path is not set", hint="give a .jsonl or .parquet file of prompts, or "
                                                              "reasoning-gym:<task>")
    elif not names_reasoning_gym(dataset):  # reasoning-gym's rows are generated in the job
        with problems.check():
            check_dataset_file("generate.dataset.path", dataset)
            _check_prompt_column(config)
    validate_reasoning_gym(config, problems, (("generate.dataset", config.generate.dataset),),
                           scores=config.generate.score)
    if config.generate.score:
        _validate_scoring(config, problems)
    output = config.generate.output_file
    parts = PurePosixPath(output).parts
    if not output.strip():
        problems.add("generate.output_file is empty", hint="e.g. generate.output_file=completions.jsonl")
    elif PurePosixPath(output).is_absolute() or ".." in parts or not parts or output.endswith("/"):
        problems.add(f"generate.output_file '{output}' must name a file inside the trial directory",
                     hint="e.g. generate.output_file=completions.jsonl")
    elif parts[0] in RESERVED_NAMES or ATTEMPT_DIR.fullmatch(parts[0]):
        problems.add(f"generate.output_file '{output}' would overwrite rlkit's own '{parts[0]}' in the trial "
                     "directory", hint="e.g. generate.output_file=completions.jsonl")


def _check_prompt_column(config: ExperimentConfig) -> None:
    """The prompt rows hold generate.dataset.prompt_key (or are GSM8K's, read as the step reads them), as grpo's
    checks judge train_dataset: JSON Lines, and Parquet where pyarrow is installed here (else checked in the job)."""
    from rlkit.checks.prompt_tools import check_prompt_tools
    from rlkit.data.dataset_head import dataset_head
    from rlkit.data.row_formats import has_prompt

    ds = config.generate.dataset
    head = dataset_head("generate.dataset.path", Path(ds.path))
    if head is not None and not has_prompt(head.columns, head.first_row, ds.prompt_key):
        raise ConfigError(f"generate.dataset.path: rows have no column '{ds.prompt_key}' (columns: "
                          f"{', '.join(head.columns) or 'none'})", hint="set generate.dataset.prompt_key to the "
                                                                        "prompt column")
    if head is not None:
        check_prompt_tools("generate.dataset", ds, head, chat_template=config.generate.apply_chat_template,
                           template_switch="generate.apply_chat_template")


def _validate_scoring(config: ExperimentConfig, problems: Problems) -> None:
    """generate.score: the reward section scores as training's would (its checks), something is scored, a reward
    model fits the client step, and the rows hold the answer column a built-in reward reads."""
    from rlkit.checks.reward import scoring_functions, validate_client_reward_model, validate_reward

    if "none" in scoring_functions(config):
        problems.add("generate.score is on but reward.fn is none: every completion would score 0, nothing would be "
                     "measured", hint="set reward.fn (or reward.fns) to the reward to score with, or "
                                      "generate.score=false")
    validate_reward(config, problems)  # imports the user's reward module
    validate_client_reward_model(config, problems)
    with problems.check():
        _check_answer_column(config)


def _check_answer_column(config: ExperimentConfig) -> None:
    """The prompt rows hold reward.answer_key where a built-in reward reads it (JSON Lines, and Parquet where
    pyarrow is installed here: otherwise each call fails in the job, counted in the summary)."""
    from rlkit.checks.reward import answer_gap, answer_readers
    from rlkit.data.dataset_head import dataset_head

    dataset, readers = config.generate.dataset.path, answer_readers(config)
    if not readers or not dataset or names_reasoning_gym(dataset) or not Path(dataset).exists():
        return  # nothing reads it, or the dataset's own problem is reported
    head = dataset_head("generate.dataset.path", Path(dataset))
    gap = answer_gap(head, config.reward.answer_key, "the generate.dataset.path rows") if head is not None else None
    if gap:
        raise ConfigError(f"reward.fn {readers[0]} needs {gap}",
                          hint="set reward.answer_key to the reference-answer column, or score with a reward that "
                               "reads none")


GENERATE = JobType(
    name="generate", help="batch generation: complete a dataset's prompts on the servers, and score them "
                          "(generate.score)",
    needs_servers=True, trainer=False, resumable=False, step="rlkit.jobs.generate.step:run_generate", trinity=(),
    sections=("generate", "gconfig", "rollout", "reward", "reasoning_gym"), prompt_dataset="generate.dataset",
    validate=_validate_generate, own_section="generate",
)
