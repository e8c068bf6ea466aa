"""Facts read torch-free from a local model's directory on the login node: its config.json, and the note rlkit writes
beside a value model's weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlkit import untrusted_json


def is_local_path(value: str) -> bool:
    """A model/tokenizer value that names a directory here (a hub id like org/name is left to the servers)."""
    return value.startswith(("/", "."))


_CONFIG_LIMIT = 16 * 2**20  # a config.json larger than this is not a model's
VALUE_HEAD_NOTE = "rlkit_value_head.json"  # written by rlkit.trainer.value_model.save_value_model beside the weights


def _dropouts(node: Any) -> list[float]:
    """Every numeric dropout probability of a (nested) model config: keys naming dropout or `pdrop` (GPT-2)."""
    found: list[float] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, (dict, list)):
                found += _dropouts(value)
            elif (("dropout" in str(key) or "pdrop" in str(key)) and isinstance(value, (int, float))
                  and not isinstance(value, bool)):
                found.append(float(value))
    elif isinstance(node, list):
        for item in node:
            found += _dropouts(item)
    return found


def read_model_config(model_dir: str) -> dict[str, Any] | None:
    """The local model's config.json as a mapping; None for a hub id or when there is none to read."""
    if not is_local_path(model_dir):
        return None
    path = Path(model_dir) / "config.json"
    try:
        if not path.is_file() or path.stat().st_size > _CONFIG_LIMIT:
            return None
        config = untrusted_json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return config if isinstance(config, dict) else None


def dropout_free(model_dir: str) -> bool | None:
    """True when the model's config.json sets every dropout probability to 0 (the model has no active dropout),
    False when one is not 0, None when there is no local config.json to read."""
    config = read_model_config(model_dir)
    if config is None:
        return None
    return not any(p != 0 for p in _dropouts(config))


def vocab_size(model_dir: str) -> int | None:
    """The model's vocab_size (of its text model, for a config that nests one), None when unknown."""
    config = read_model_config(model_dir)
    if config is None:
        return None
    value = config.get("vocab_size")
    text = config.get("text_config")
    if value is None and isinstance(text, dict):
        value = text.get("vocab_size")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def model_positions(model_dir: str) -> int | None:
    """The model's own context length (max_position_embeddings of its config.json); None for a hub id or when
    unreadable (the model check says why)."""
    config = read_model_config(model_dir)
    value = config.get("max_position_embeddings") if config is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


VALUE_HEAD = "value_head"  # a reward model written by rlkit's job type rw (reward_model_format)
SEQUENCE_CLASSIFIER = "sequence_classification"  # a reward model trained elsewhere (reward_model_format)


def reward_model_format(model_dir: str) -> str:
    """How a reward model directory scores: VALUE_HEAD (written by rlkit's rw: a value per token, the last one read),
    SEQUENCE_CLASSIFIER (a Hugging Face `*ForSequenceClassification` with one label, trained elsewhere: one logit at
    the last token, its own tokenizer and chat template), or "" when it is neither."""
    note = Path(model_dir) / VALUE_HEAD_NOTE
    try:
        if note.is_file() and note.stat().st_size < _CONFIG_LIMIT:
            kind = untrusted_json.loads(note.read_text())
            if isinstance(kind, dict) and kind.get("kind") == "reward":
                return VALUE_HEAD
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    config = read_model_config(model_dir) or {}
    architectures = config.get("architectures")
    labels = config.get("id2label")
    one_label = config.get("num_labels") == 1 or (isinstance(labels, dict) and len(labels) == 1)
    if isinstance(architectures, list) and len(architectures) == 1 and isinstance(architectures[0], str) \
            and architectures[0].endswith("ForSequenceClassification") and one_label:
        return SEQUENCE_CLASSIFIER
    return ""
