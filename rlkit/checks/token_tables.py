"""Comparing two models' token tables at submit (tokenizer.json or vocab.json, read from local directories): a
reference model (rlkit.checks.reference) or a distillation teacher (rlkit.jobs.distill.checks) must read the actor's
token ids as the same tokens. Torch-free, and importing nothing of rlkit.jobs (the job types' checks import it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlkit import untrusted_json
from rlkit.config.model_config import is_local_path

_TOKENIZER_LIMIT = 64 * 2**20  # a tokenizer file larger than this is not compared (the vocab_size check stays)


def first_difference(one: str, other: str, label: str = "the reference") -> str:
    """The first difference of the two directories' token tables ('' when equal or not both readable here);
    `label` names `one` in the message."""
    for name in ("tokenizer.json", "vocab.json"):
        a, b = _read(one, name), _read(other, name)
        if a is None or b is None:
            continue
        if a == b:
            return ""
        ta, tb = _token_table(name, a), _token_table(name, b)
        if ta is None or tb is None:
            return ""
        for token_id in sorted(set(ta) | set(tb)):
            if ta.get(token_id) != tb.get(token_id):
                return (f"token id {token_id} is {ta.get(token_id, 'absent')!r} in {name} of {label}, "
                        f"{tb.get(token_id, 'absent')!r} in the job's")
        return ""
    return ""


def _read(directory: str, name: str) -> bytes | None:
    path = Path(directory) / name
    try:
        if not is_local_path(directory) or not path.is_file() or path.stat().st_size > _TOKENIZER_LIMIT:
            return None
        return path.read_bytes()
    except OSError:
        return None


def _token_table(name: str, data: bytes) -> dict[int, str] | None:
    """Token id -> token of a tokenizer.json (its model's vocabulary and added tokens) or a vocab.json; None when
    the file is not one rlkit can read."""
    try:
        parsed: Any = untrusted_json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(parsed, dict):
        return None
    table: dict[int, str] = {}
    model = parsed.get("model")
    vocab = (model.get("vocab") if isinstance(model, dict) else None) if name == "tokenizer.json" else parsed
    if isinstance(vocab, dict):
        table.update({i: str(t) for t, i in vocab.items() if isinstance(i, int)})
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...] by id
        table.update({i: str(item[0]) for i, item in enumerate(vocab) if isinstance(item, list) and item})
    else:
        return None
    for added in parsed.get("added_tokens", []) if name == "tokenizer.json" else []:
        if isinstance(added, dict) and isinstance(added.get("id"), int):
            table[added["id"]] = str(added.get("content"))
    return table
