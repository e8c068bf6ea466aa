"""Submit-time checks of job types rw and dpo (the `rw`/`dpo` sections and their pair dataset) and of the PPO
critic (`critic`): every problem collected, each naming its field and its fix. Torch-free (login node).

These cover what is particular to pairs and critics; validate_rw and validate_dpo also run the checks every trainer
shares (rlkit.checks.trainer: model, optimizer, micro-batches, recover, saver, stats logger, epochs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlkit.checks.site_files import check_chat_template, check_dataset_file, check_model_dir
from rlkit.checks.trainer import DTYPES, validate_optimizer, validate_trainer
from rlkit.config.problems import Problems
from rlkit.config.schema.actor import PACKING_ALGORITHMS
from rlkit.config.schema.experiment import DatasetConfig, ExperimentConfig
from rlkit.config.schema.pairs import DPO_LOSS_TYPES, PairDataConfig
from rlkit.data.dataset_head import dataset_head
from rlkit.data.row_formats import pair_row
from rlkit.errors import ConfigError


def validate_rw(config: ExperimentConfig, problems: Problems) -> None:
    """Add every problem of a job of type rw to `problems`."""
    validate_trainer(config, problems)
    _validate_pair_data(config, config.rw, "rw", problems)


def validate_dpo(config: ExperimentConfig, problems: Problems) -> None:
    """Add every problem of a job of type dpo to `problems`."""
    dpo = config.dpo
    validate_trainer(config, problems)
    _validate_pair_data(config, dpo, "dpo", problems)
    if not dpo.beta > 0:
        problems.add(f"dpo.beta must be positive (got {dpo.beta}): it scales the implicit rewards, and at 0 the "
                     "loss has no gradient", hint="e.g. dpo.beta=0.1")
    if dpo.loss_type not in DPO_LOSS_TYPES:
        problems.add(f"dpo.loss_type '{dpo.loss_type}' is not one of: {', '.join(DPO_LOSS_TYPES)}",
                     hint="use dpo.loss_type=sigmoid (other variants, such as AReaL's ipo, are not implemented)")
    if not 0 <= dpo.label_smoothing < 0.5:
        problems.add(f"dpo.label_smoothing must be in [0, 0.5) (got {dpo.label_smoothing}): at 0.5 the loss no "
                     "longer prefers either answer", hint="0 for the original DPO loss, e.g. 0.1 for noisy labels")
    if dpo.ref_path:
        with problems.check():
            check_model_dir("dpo.ref_path", dpo.ref_path)
    elif not config.actor.path:
        problems.add("dpo has no reference model: dpo.ref_path and actor.path are both empty",
                     hint="set actor.path (the reference is then the model DPO starts from), or dpo.ref_path")


def validate_critic(config: ExperimentConfig, problems: Problems) -> None:
    """Add every problem of the `critic` section (job type ppo) to `problems`."""
    critic = config.critic
    path = critic.path or config.actor.path
    if not path:
        problems.add("the critic has no model: critic.path and actor.path are both empty",
                     hint="set critic.path to a Hugging Face model directory (or actor.path, which it falls back to)")
    else:
        with problems.check():
            check_model_dir("critic.path" if critic.path else "actor.path", path)
    if critic.dtype not in DTYPES:
        problems.add(f"critic.dtype '{critic.dtype}' is not one of: {', '.join(DTYPES)}",
                     hint="e.g. critic.dtype=bfloat16")
    if not critic.eps_clip > 0:
        problems.add(f"critic.eps_clip must be positive (got {critic.eps_clip}): it is how far a value may move from "
                     "its rollout-time value before the loss stops pulling it", hint="e.g. critic.eps_clip=0.5 "
                                                                                    "(AReaL's default)")
    validate_optimizer("critic.optimizer", critic.optimizer, problems)
    if critic.mb_spec.packing_algorithm not in PACKING_ALGORITHMS:
        problems.add(f"critic.mb_spec.packing_algorithm '{critic.mb_spec.packing_algorithm}' is not one of: "
                     f"{', '.join(PACKING_ALGORITHMS)}", hint="e.g. critic.mb_spec.packing_algorithm=ffd")
    sequences = config.train_dataset.batch_size * max(1, config.actor.group_size)
    if critic.ppo_n_minibatches >= 1 and sequences % critic.ppo_n_minibatches:
        problems.add(f"a batch of {sequences} sequences (train_dataset.batch_size x actor.group_size) does not split "
                     f"into critic.ppo_n_minibatches={critic.ppo_n_minibatches} equal minibatches",
                     hint="choose critic.ppo_n_minibatches dividing the number of sequences per step")


def _validate_pair_data(config: ExperimentConfig, section: PairDataConfig, name: str, problems: Problems) -> None:
    """The pair columns are named, distinct, and present in the dataset's first row with matching kinds."""
    for key in ("chosen_key", "rejected_key"):
        if not getattr(section, key):
            problems.add(f"{name}.{key} is empty", hint=f"name the dataset column, e.g. {name}.{key}="
                                                        f"{key.removesuffix('_key')}")
    if section.chosen_key and section.chosen_key == section.rejected_key:
        problems.add(f"{name}.chosen_key and {name}.rejected_key are both '{section.chosen_key}': a pair needs two "
                     "different answers", hint=f"e.g. {name}.chosen_key=chosen {name}.rejected_key=rejected")
    ds = config.train_dataset
    if ds.max_length == 1:  # below 1 is refused by its range (rlkit.config.ranges)
        problems.add(f"train_dataset.max_length must be at least 2 tokens or null (got {ds.max_length}): it limits "
                     "prompt + answer of each pair", hint="e.g. train_dataset.max_length=2048")
    for field, dataset in (("train_dataset", ds), ("valid_dataset", config.valid_dataset)):
        if field == "train_dataset" and not dataset.path:
            columns = f"{{{ds.prompt_key}, {section.chosen_key}, {section.rejected_key}}}"
            problems.add("train_dataset.path is not set", hint=f"give a .jsonl or .parquet file of {columns} rows")
        elif dataset.path:
            with problems.check():
                _check_pair_row(field, dataset, section, name, config.tokenizer_path or config.actor.path,
                                "tokenizer_path" if config.tokenizer_path else "actor.path")


def _check_pair_row(field: str, dataset: DatasetConfig, section: PairDataConfig, name: str, tokenizer: str,
                    tokenizer_field: str) -> None:
    """The pair columns are in the dataset, their first values of kinds that go together (JSON Lines, and Parquet
    where pyarrow is installed here: without it a Parquet file's columns are checked in the job)."""
    check_dataset_file(f"{field}.path", dataset.path)
    head = dataset_head(f"{field}.path", Path(dataset.path))
    if head is None:
        return
    first = head.first_row([dataset.prompt_key, section.chosen_key, section.rejected_key])
    row = None if first is None else dict(pair_row(first, dataset.prompt_key, section.chosen_key,
                                                   section.rejected_key))
    present = set(head.columns) | set(row or ())  # an hh-rlhf pair's prompt is cut from its answers (pair_row)
    keys = {"prompt_key": (f"{field}.prompt_key", dataset.prompt_key),
            "chosen_key": (f"{name}.chosen_key", section.chosen_key),
            "rejected_key": (f"{name}.rejected_key", section.rejected_key)}
    # an empty answer key is reported on its own; an empty prompt key is a column no row has
    absent = [(setting, column) for role, (setting, column) in keys.items()
              if (column or role == "prompt_key") and column not in present]
    if absent:
        raise ConfigError(f"{field}.path: rows have no column {', '.join(repr(c) for _, c in absent)} (columns: "
                          f"{', '.join(head.columns) or 'none'})", hint=f"set {' and '.join(s for s, _ in absent)} "
                                                                        "to the dataset's column names")
    if row is None:
        return  # no rows in its first file: nothing to judge the kinds by
    prompt = row[dataset.prompt_key]
    for setting, column in list(keys.values())[1:]:
        if column and not _answer_fits(prompt, row[column]):
            raise ConfigError(f"{field}.path: the first row's '{column}' ({setting}) is a "
                              f"{type(row[column]).__name__}, which does not go with a prompt of "
                              f"{'chat messages' if isinstance(prompt, list) else type(prompt).__name__}",
                              hint="give text answers to text prompts, and a string or chat messages to chat prompts")
    if isinstance(prompt, list):
        check_chat_template(tokenizer_field, tokenizer, f"the rows of {field} are chats (their prompts are messages)")


def _answer_fits(prompt: Any, answer: Any) -> bool:
    """A text prompt takes a text answer; chat messages a string or messages."""
    if isinstance(prompt, str):
        return isinstance(answer, str)
    if isinstance(prompt, list):
        return isinstance(answer, str) or (isinstance(answer, list) and all(isinstance(m, dict) for m in answer))
    return False
