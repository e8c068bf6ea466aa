"""Local datasets (jsonl, json or parquet; a file or a directory of them), the order an epoch visits their rows, and
prompt tokenization."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rlkit.errors import StepError

SUFFIX_FORMAT = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a local dataset, in file order, with `datasets` (no hub access)."""
    import datasets

    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.suffix in SUFFIX_FORMAT) if path.is_dir() else [path]
    if not files:
        raise StepError(f"dataset {path} holds no .jsonl, .json or .parquet file")
    formats = {SUFFIX_FORMAT.get(f.suffix) for f in files}
    if len(formats) != 1 or None in formats:
        raise StepError(f"dataset {path}: mixed or unknown file types {sorted(f.suffix for f in files)}")
    datasets.disable_progress_bars()
    table = datasets.load_dataset(formats.pop(), data_files=[str(f) for f in files], split="train",
                                  keep_in_memory=True)
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
