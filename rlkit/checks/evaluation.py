"""Submit-time checks of evaluation during training (`evaluator`, `eval_gconfig`, `valid_dataset`; job types grpo, ppo).

Torch-free and collecting: each mistake is one problem naming its field and fix. An evaluation that could only
fail minutes into training (no validation set, a column the reward reads is missing, no sample per prompt) is
refused here instead.
"""

from __future__ import annotations

from pathlib import Path

from rlkit.checks.prompt_tools import check_prompt_tools
from rlkit.checks.reward import answer_gap, answer_readers
from rlkit.checks.sampling import validate_eval_greedy, validate_eval_min_new_tokens
from rlkit.checks.site_files import check_dataset_file
from rlkit.config.problems import Problems
from rlkit.config.schema.evaluation import evaluation_enabled
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.schema.reasoning_gym import names_reasoning_gym
from rlkit.data.dataset_head import dataset_head
from rlkit.data.row_formats import has_prompt
from rlkit.errors import ConfigError


def validate_evaluator(config: ExperimentConfig, problems: Problems) -> None:
    """Add every problem of the evaluation fields to `problems`."""
    ev, ds = config.evaluator, config.valid_dataset
    enabled = evaluation_enabled(ev)
    if enabled and not ds.path:
        problems.add("evaluator is on (freq_steps, freq_epochs, freq_secs or eval_on_startup set) but "
                     "valid_dataset.path is empty: there is nothing to evaluate on",
                     hint="set valid_dataset.path to held-out prompts, or turn the evaluator's frequencies off")
    if ds.path and not enabled:
        problems.add("valid_dataset.path is set but the evaluator never runs, so it would be ignored",
                     hint="set evaluator.freq_steps (or freq_epochs / freq_secs / eval_on_startup), or remove "
                          "valid_dataset")
    _validate_sampling(config, problems)
    if ds.path:
        with problems.check():
            _validate_columns(config)


def _validate_sampling(config: ExperimentConfig, problems: Problems) -> None:
    g = config.eval_gconfig
    if g.top_k is not None and (g.top_k == 0 or g.top_k < -1):
        problems.add(f"eval_gconfig.top_k must be -1 (off) or at least 1 (got {g.top_k})")
    validate_eval_min_new_tokens(config, problems)
    validate_eval_greedy(config, problems)


def _validate_columns(config: ExperimentConfig) -> None:
    """The validation rows hold the prompt column and, for a built-in reward, the answer column (JSON Lines, and
    Parquet where pyarrow is installed here: without it a Parquet file's columns are checked in the job)."""
    ds = config.valid_dataset
    if names_reasoning_gym(ds.path):
        return  # generated in the job: rlkit.checks.reasoning_gym
    check_dataset_file("valid_dataset.path", ds.path)
    head = dataset_head("valid_dataset.path", Path(ds.path))
    if head is None:
        return  # Parquet without pyarrow here, or another format: checked when the job loads it
    columns = ", ".join(head.columns) or "none"
    if not has_prompt(head.columns, head.first_row, ds.prompt_key):
        raise ConfigError(f"valid_dataset.path: rows have no column '{ds.prompt_key}' (columns: {columns})",
                          hint="set valid_dataset.prompt_key to the prompt column")
    # a string prompt is sent as raw text (an episode renders its own first prompt)
    check_prompt_tools("valid_dataset", ds, head, chat_template=False,
                       episodes=bool(config.rollout.agent.workflow))
    readers = answer_readers(config)  # reward.fn, or every function of a reward.fns mix
    gap = answer_gap(head, config.reward.answer_key, "the valid_dataset rows") if readers else None
    if gap:
        raise ConfigError(f"reward.fn {readers[0]} scores evaluations against {gap}",
                          hint="give validation rows with the training set's answer column")
