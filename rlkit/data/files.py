"""Local datasets (jsonl, json or parquet; a file or a directory of them), the order an epoch visits their rows, and
prompt tokenization."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

from rlkit import untrusted_json
from rlkit.data.chat_tools import ignores_tools
from rlkit.errors import StepError

SUFFIX_FORMAT = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a local dataset, in file order, every row with every column (None where a row lacks one, as a
    table has it). JSON and JSON Lines are read here as written (an integer stays an integer, a row's nested keys are
    its own); Parquet through `datasets`, its cache in a temporary directory on this node. Never through the user's
    ~/.cache/huggingface: on a cluster that is NFS, where `datasets`' file locks can fail or hang, and every load
    left a cache entry there."""
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.suffix in SUFFIX_FORMAT) if path.is_dir() else [path]
    if not files:
        raise StepError(f"dataset {path} holds no .jsonl, .json or .parquet file")
    formats = {SUFFIX_FORMAT.get(f.suffix) for f in files}
    if len(formats) != 1 or None in formats:
        raise StepError(f"dataset {path}: mixed or unknown file types {sorted(f.suffix for f in files)}")
    special = [f for f in files if not f.is_file()]  # a FIFO would block the job forever; a device never end
    if special:
        raise StepError(f"dataset {path}: {special[0]} is not a regular file")
    if formats == {"parquet"}:
        return _parquet_rows(files)
    return _same_columns([row for file in files for row in _json_rows(file)])


def _json_rows(file: Path) -> list[dict[str, Any]]:
    """The objects of a JSON Lines file (one per non-blank line), or of a JSON file holding a list (of objects; of
    strings, each read as {"text": ...})."""
    try:
        text = file.read_text(encoding="utf-8-sig")  # -sig: a byte-order mark is not part of the first row
    except (OSError, UnicodeDecodeError) as exc:
        raise StepError(f"dataset file {file} cannot be read as UTF-8 text: "
                        f"{getattr(exc, 'strerror', None) or exc}") from None
    if text.lstrip().startswith("["):
        try:
            items = untrusted_json.loads(text)
        except ValueError as exc:  # not JSON, or nested deeper than Python's stack (rlkit.untrusted_json)
            raise StepError(f"dataset file {file} is not valid JSON: {exc}") from None
        rows = [{"text": item} if isinstance(item, str) else item for item in items]
        wrong = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
        if wrong is not None:
            raise StepError(f"dataset file {file}: item {wrong} of its list is a {type(rows[wrong]).__name__}, "
                            "not an object (a row) or a string")
        return rows
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = untrusted_json.loads(line)
        except ValueError as exc:
            raise StepError(f"dataset file {file}: line {number} is not JSON ({exc}); write one JSON object per line "
                            "(or a .json file holding one list of objects)") from None
        if not isinstance(row, dict):
            raise StepError(f"dataset file {file}: line {number} is a {type(row).__name__}, not a JSON object")
        rows.append(row)
    return rows


def _same_columns(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row with every column of the dataset (in the order first seen), None where a row lacks one."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    if all(len(row) == len(columns) for row in rows):
        return rows
    return [{key: row.get(key) for key in columns} for row in rows]


def _parquet_rows(files: list[Path]) -> list[dict[str, Any]]:
    import datasets

    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="rlkit-datasets-") as cache:  # $TMPDIR: a job's node-local directory
        table = datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train",
                                      keep_in_memory=True, cache_dir=cache)
        return [dict(row) for row in table]


def epoch_order(n: int, epoch: int, seed: int, shuffle: bool) -> list[int]:
    """The order rows are visited in one epoch: a permutation fixed by (seed, epoch), so a resumed run knows it from
    the epoch alone (GRPO's prompt stream and the trainer-only job types' batches both use it)."""
    order = list(range(n))
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def no_place_for_tools(prompt: Any, *, chat_template: bool, setting: str, template_switch: str = "") -> str | None:
    """Why a prompt with tools could not carry them, or None: token ids are rendered already, and a string sent as
    raw text has no place for them (`template_switch`: the setting that would wrap it in the chat template)."""
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return (f"the row has tools ({setting}) but its prompt is token ids, rendered already: they have no place for "
                f"the tools; give the prompt as chat messages, or set {setting}='' to read no tools column")
    if isinstance(prompt, str) and not chat_template:
        wrap = f" (or set {template_switch}=true)" if template_switch else ""
        return (f"the row has tools ({setting}) but its prompt is a string sent as raw text, which has no place for "
                f"them; give the prompt as chat messages{wrap}, or set {setting}='' to read no tools column")
    return None


def prompt_token_ids(prompt: Any, tokenizer: Any, *, chat_template: bool, tools: list[dict[str, Any]] | None = None,
                     setting: str = "tools_key", template_switch: str = "") -> list[int]:
    """Token ids of a prompt given as a string, a list of chat messages, or a list of token ids. `tools`: the row's
    function schemas (rlkit.data.chat_tools; `setting` names the config key that read them), given to the chat
    template; ValueError where the prompt has no render to hold them (`no_place_for_tools`) or the template ignores
    or fails on them."""
    why = no_place_for_tools(prompt, chat_template=chat_template, setting=setting,
                             template_switch=template_switch) if tools else None
    if why:
        raise ValueError(why)
    if isinstance(prompt, str):
        if chat_template:
            return _templated([{"role": "user", "content": prompt}], tokenizer, tools, setting)
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt):
        return _templated(prompt, tokenizer, tools, setting)
    raise StepError(f"cannot read a prompt of type {type(prompt).__name__}: give a string, chat messages or token ids")


def _templated(messages: list[dict[str, Any]], tokenizer: Any, tools: list[dict[str, Any]] | None,
               setting: str) -> list[int]:
    """The chat through the template, ending where the assistant starts (the row's tools given to it, when any)."""
    def render(**kwargs: Any) -> list[int]:
        # return_dict=False: transformers 5 returns a BatchEncoding (whose list() is its keys) by default
        return list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                  return_dict=False, **kwargs))

    if not tools:
        return render()
    try:
        ids = render(tools=tools)
    except Exception as exc:  # Jinja's errors (raise_exception too), a TypeError of a value it cannot join
        raise ValueError(f"the chat template failed on this prompt and its tools ({setting}): "
                         f"{type(exc).__name__}: {exc}") from None
    if ignores_tools(ids, render):
        raise ValueError(f"the row has tools ({setting}) but the chat template renders the prompt the same without "
                         "them, so the model would be asked to call tools it was never shown; use a tokenizer whose "
                         "chat template renders `tools` (tokenizer_path: the model's tool-use template), or set "
                         f"{setting}='' to read no tools column")
    return ids
