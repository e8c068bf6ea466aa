"""Local datasets (jsonl, json or parquet; a file or a directory of them), the order an epoch visits their rows, and
prompt tokenization."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

from rlkit import untrusted_json
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


def prompt_token_ids(prompt: Any, tokenizer: Any, *, chat_template: bool) -> list[int]:
    """Token ids of a prompt given as a string, a list of chat messages, or a list of token ids."""
    if isinstance(prompt, str):
        if chat_template:
            return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True,
                                                      add_generation_prompt=True, return_dict=False))
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt):
        # return_dict=False: transformers 5 returns a BatchEncoding (whose list() is its keys) by default
        return list(tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True,
                                                  return_dict=False))
    raise StepError(f"cannot read a prompt of type {type(prompt).__name__}: give a string, chat messages or token ids")
