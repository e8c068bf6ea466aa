"""Submit-time checks of job type sft: every problem collected, each naming its field and its fix (torch-free).

The datasets must exist, be marked `type: sft` and hold the columns `sft` names; the columns must not contradict
each other; and max_length must fit both the model and the micro-batch token budget, since a row that fits neither
would fail the trainer after it queued and loaded. Checks every trainer shares (optimizer, saver, recover, stats
logger) are not repeated here.
"""

from __future__ import annotations

from pathlib import Path

from rlkit.checks.site_files import check_chat_template, check_dataset_file
from rlkit.checks.trainer import validate_trainer
from rlkit.config.allocation import parse_allocation
from rlkit.config.model_config import model_positions
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import DatasetConfig, ExperimentConfig
from rlkit.config.schema.sft import SFT_PROMPT_TYPES, SFTConfig
from rlkit.data.chat_tools import row_tools
from rlkit.data.dataset_head import DatasetHead, dataset_head
from rlkit.data.row_formats import GSM8K_COLUMNS, sft_columns
from rlkit.errors import ConfigError

_PLAINTEXT_ONLY = ("system_prompt_key", "system_prompt")


def validate_sft(config: ExperimentConfig, problems: Problems) -> None:
    """Add every problem of the sft fields (and of the shared fields as sft reads them) to `problems`."""
    sft = config.sft
    if sft.prompt_type not in SFT_PROMPT_TYPES:
        problems.add(f"sft.prompt_type '{sft.prompt_type}' is not one of: {', '.join(SFT_PROMPT_TYPES)}",
                     hint="plaintext for prompt/response columns, messages for a column of chats")
    else:
        _validate_keys(config, problems)
    _validate_dataset(config, "train_dataset", required=True, problems=problems)
    _validate_dataset(config, "valid_dataset", required=False, problems=problems)
    validate_trainer(config, problems)
    _validate_lengths(config, problems)
    _validate_layout(config, problems)
    if sft.prompt_type in SFT_PROMPT_TYPES and sft.apply_chat_template and not sft.chat_template:
        field = "tokenizer_path" if config.tokenizer_path else "actor.path"
        with problems.check():
            check_chat_template(field, config.tokenizer_path or config.actor.path,
                                "sft.apply_chat_template renders every row with it")


def _validate_keys(config: ExperimentConfig, problems: Problems) -> None:
    sft, default = config.sft, SFTConfig()
    if sft.prompt_type == "plaintext":
        keys = {f"sft.{name}": getattr(sft, name) for name in ("prompt_key", "response_key", "system_prompt_key")}
        for field in ("sft.prompt_key", "sft.response_key"):
            if not keys[field]:
                problems.add(f"{field} is empty",
                             hint=f"name the dataset column, e.g. {field}={getattr(default, field[4:])}")
        seen: dict[str, str] = {}
        for field, key in keys.items():
            if key and key in seen:
                problems.add(f"{field} and {seen[key]} are both '{key}': one column cannot be two parts of a row",
                             hint=f"set {field} to its own column")
            seen.setdefault(key, field)
        if sft.enable_concatenated_multi_turn:
            problems.add("sft.enable_concatenated_multi_turn applies to chats (sft.prompt_type messages); a plaintext "
                         "row has one response", hint="remove it, or set sft.prompt_type=messages")
        if sft.chat_template and not sft.apply_chat_template:
            problems.add("sft.chat_template is set but sft.apply_chat_template is false: the template would be "
                         "ignored", hint="remove sft.chat_template, or set sft.apply_chat_template=true")
    else:
        if not sft.messages_key:
            problems.add("sft.messages_key is empty", hint="name the column holding the chats, e.g. "
                                                           "sft.messages_key=messages")
        for name in _PLAINTEXT_ONLY:
            if getattr(sft, name):
                problems.add(f"sft.{name} applies to plaintext rows; a chat carries its own system message",
                             hint=f"remove sft.{name}, or put the system message into the chats")
        if not sft.apply_chat_template:
            problems.add("sft.apply_chat_template is false, but chats (sft.prompt_type messages) are always rendered "
                         "with the chat template", hint="remove sft.apply_chat_template")
    validate_sft_row_keys(config, ("train_dataset", "valid_dataset"), problems)


def validate_sft_row_keys(config: ExperimentConfig, names: tuple[str, ...], problems: Problems) -> None:
    """Datasets of sft rows (job type sft's, a mix's expert_dataset) are read with the sft section's column keys: a
    dataset's own prompt_key or tools_key set otherwise would be ignored, so it is refused, naming the sft key."""
    sft = config.sft
    for name in names:
        ds: DatasetConfig = getattr(config, name)
        for key in ("prompt_key", "tools_key"):
            value, read = getattr(ds, key), getattr(sft, key)
            if value != getattr(DatasetConfig(), key) and value != read:
                problems.add(f"{name}.{key} is '{value}', but sft rows are read with the sft section's keys "
                             f"(sft.{key} is '{read}')", hint=f"set sft.{key}={value} and remove {name}.{key}")


def _validate_dataset(config: ExperimentConfig, name: str, *, required: bool, problems: Problems) -> None:
    ds: DatasetConfig = getattr(config, name)
    if not ds.path:
        if required:
            problems.add(f"{name}.path is not set", hint="give a .jsonl or .parquet file of sft rows")
        return
    if ds.type != "sft":
        problems.add(f"{name}.type is '{ds.type}', but job type sft trains on sft rows",
                     hint=f"set {name}.type=sft")
    if ds.batch_size < 1:
        problems.add(f"{name}.batch_size must be at least 1 (got {ds.batch_size})")
    with problems.check():
        check_dataset_file(f"{name}.path", ds.path)
        head = dataset_head(f"{name}.path", Path(ds.path))
        if head is not None and config.sft.prompt_type in SFT_PROMPT_TYPES:
            _check_row(name, head, config.sft)


def _check_row(name: str, head: DatasetHead, sft: SFTConfig) -> None:
    """The dataset has the columns sft names, the first row's values of the right kind (JSON Lines, and Parquet
    where pyarrow is installed here: without it a Parquet file's columns are checked in the job)."""
    columns = ", ".join(head.columns) or "none"
    _check_tools(name, head, sft)
    if sft.prompt_type == "messages":
        if sft.messages_key not in head.columns:
            raise ConfigError(f"{name}.path: rows have no column '{sft.messages_key}' (columns: {columns})",
                              hint="set sft.messages_key to the column holding the chats, or sft.prompt_type="
                                   "plaintext for prompt/response columns")
        row = head.first_row([sft.messages_key])
        if row is None:
            return  # no rows in its first file: nothing to judge the chats by
        chat = row.get(sft.messages_key)
        if not (isinstance(chat, list) and chat and all(isinstance(m, dict) and "role" in m
                                                        and ("content" in m or m.get("tool_calls")) for m in chat)):
            raise ConfigError(f"{name}.path: column '{sft.messages_key}' of the first row is not a list of "
                              "{role, content} messages", hint="write each chat as [{role: ..., content: ...}, ...]")
        if not any(m["role"] == "assistant" for m in chat):
            raise ConfigError(f"{name}.path: the first row's chat has no assistant message, so nothing to train on",
                              hint="each chat needs at least one message with role assistant")
        return
    first = head.first_row([sft.prompt_key, sft.response_key, *GSM8K_COLUMNS])
    # a dataset with no rows in its first file: only the columns are judged, GSM8K's taken for GSM8K's
    row = first if first is not None else dict.fromkeys(head.columns, "")
    for field, key in zip(("prompt_key", "response_key"), sft_columns(row, sft.prompt_key, sft.response_key),
                          strict=True):
        if key and key not in head.columns:
            raise ConfigError(f"{name}.path: rows have no column '{key}' (sft.{field}; columns: {columns})",
                              hint=f"set sft.{field} to the right column")
        if key and not isinstance(row[key], str):
            raise ConfigError(f"{name}.path: column '{key}' (sft.{field}) holds {type(row[key]).__name__}, not text",
                              hint="for a column of chats use sft.prompt_type=messages")


def _check_tools(name: str, head: DatasetHead, sft: SFTConfig) -> None:
    """The first row's tools column (sft.tools_key), when the dataset has one: the schemas as a list or a JSON string
    of one, and a place for them in the text (the chat template). Whether the template renders them is judged as
    the job reads the rows (rlkit.jobs.sft.data)."""
    if not sft.tools_key or sft.tools_key not in head.columns:
        return
    row = head.first_row([sft.tools_key])
    try:
        tools = row_tools(row or {}, sft.tools_key)
    except ValueError as exc:
        raise ConfigError(f"{name}.path: the first row's {exc}",
                          hint="fix the rows' tools, or set sft.tools_key='' to read no tools column") from None
    if tools and sft.prompt_type == "plaintext" and not sft.apply_chat_template:
        raise ConfigError(f"{name}.path: rows have tools (column '{sft.tools_key}', sft.tools_key) but "
                          "sft.apply_chat_template is false: raw text has no place for them",
                          hint="set sft.apply_chat_template=true, or sft.tools_key='' to train without the tools")


def _validate_lengths(config: ExperimentConfig, problems: Problems) -> None:
    """max_length, the micro-batch budget and the model's context must agree: every kept row must fit all three."""
    spec, sft = config.actor.mb_spec, config.sft
    budget = spec.max_tokens_per_mb
    if budget is not None and budget < 2:  # below 1 is validate_trainer's to report
        if budget == 1:
            problems.add(f"actor.mb_spec.max_tokens_per_mb must be at least 2 tokens or null (got {budget})",
                         hint="e.g. actor.mb_spec.max_tokens_per_mb=16384")
        budget = None
    positions = model_positions(config.actor.path)
    for name in ("train_dataset", "valid_dataset"):
        ds: DatasetConfig = getattr(config, name)
        if name == "valid_dataset" and not ds.path:
            continue
        limit = ds.max_length
        if limit is None:  # the trainer keeps rows of at most the micro-batch budget (sft_row_limit)
            if sft.truncate:
                problems.add(f"sft.truncate needs {name}.max_length (the length to cut rows to)",
                             hint=f"set {name}.max_length, or remove sft.truncate")
            continue
        if limit < 2:
            problems.add(f"{name}.max_length must be at least 2 (a context token and a target token; got {limit})")
            continue
        if budget is not None and limit > budget:
            problems.add(f"{name}.max_length ({limit}) exceeds actor.mb_spec.max_tokens_per_mb ({budget}): a row of "
                         "that length would fit no micro-batch",
                         hint=f"lower {name}.max_length to {budget} or raise actor.mb_spec.max_tokens_per_mb")
        if positions is not None and limit > positions:
            problems.add(f"{name}.max_length ({limit}) exceeds the model's context of {positions} tokens "
                         f"(max_position_embeddings of {config.actor.path})",
                         hint=f"set {name}.max_length to at most {positions}")


def _validate_layout(config: ExperimentConfig, problems: Problems) -> None:
    """Each trainer rank must get at least one row of a batch (the layout itself, trainer part only, is checked for
    every job type by rlkit.checks.layout)."""
    try:
        allocation = parse_allocation(config.allocation_mode)
    except ConfigError:
        return  # reported by the common checks
    if allocation.trainer is None:
        return
    ranks, batch = allocation.trainer.dp, config.train_dataset.batch_size
    if 1 <= batch < ranks:
        problems.add(f"train_dataset.batch_size ({batch}) is smaller than the {ranks} trainer ranks: some ranks "
                     "would have no row to train on", hint=f"set train_dataset.batch_size to at least {ranks}")
