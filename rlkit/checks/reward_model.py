"""Submit-time checks of `reward.fn: reward_model` (torch-free): the directory is a reward model written by job type
rw, with a tokenizer, over the actor's vocabulary, or a Hugging Face sequence classifier with one label (trained
elsewhere) with its own tokenizer. A wrong directory would otherwise surface minutes into the job as
a reward of 0 for every completion (RewardRunner scores a failing call 0).

In a multi-stage run the directory may be an earlier rw stage's checkpoints/final, not written yet
(rlkit.launch.stages hands it over): while it is pending, its checks read the model that stage trains from (its
stand-in, as a later stage's actor.path is checked): the vocabulary. What rw writes (the value-head note, the
tokenizer) is rw's to guarantee."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from rlkit import untrusted_json
from rlkit.checks.site_files import TOKENIZER_FILES
from rlkit.config.model_config import VALUE_HEAD, VALUE_HEAD_NOTE, reward_model_format
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.served_models import REWARD_MODEL, scores_with_reward_model

FIELD = "reward.reward_model_path"
_PENDING: ContextVar[tuple[str, str]] = ContextVar("pending_reward_model", default=("", ""))


@contextmanager
def pending_reward_model(path: str, stand_in: str) -> Iterator[None]:
    """While in the block, `path` (an rw stage's final, not written yet) is checked as `stand_in`, the model that
    stage trains from; nothing changes once `path` exists, or without a stand-in."""
    token = _PENDING.set((path, stand_in) if stand_in and path and not Path(path).exists() else ("", ""))
    try:
        yield
    finally:
        _PENDING.reset(token)


def _json(path: Path) -> dict[str, Any]:
    """A JSON object from a file, {} when it is missing, unreadable, not a regular file or not an object."""
    try:
        if not path.is_file():
            return {}
        data = untrusted_json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def validate_reward_model(config: ExperimentConfig, problems: Problems) -> None:
    """Every problem of reward_model_path, given reward.fn (or reward.fns)."""
    reward = config.reward
    path = reward.reward_model_path
    if not scores_with_reward_model(reward):
        if path:
            which = f"reward.fns lists no {REWARD_MODEL}" if reward.fns else f"reward.fn is {reward.fn!r}"
            problems.add(f"{FIELD} is set, but {which}: it would be ignored",
                         hint=f"score with {REWARD_MODEL} (reward.fn, or a key of reward.fns), or remove {FIELD}")
        return
    if not path:
        return  # resolve_reward_fn reports it
    pending, stand_in = _PENDING.get()
    if path == pending:
        _check_vocabulary(config, Path(stand_in), problems)
        return
    model = Path(path)
    if not model.is_dir():
        problems.add(f"{FIELD}: '{path}' is not a directory", hint="point it at an rw trial's checkpoints/final",
                     site=True)
        return
    form = reward_model_format(path)
    if not form:
        note = _json(model / VALUE_HEAD_NOTE)
        what = f"a {note['kind']} model" if note.get("kind") else f"no {VALUE_HEAD_NOTE}"
        problems.add(f"{FIELD}: '{path}' is neither a reward model written by job type rw ({what}) nor a Hugging "
                     "Face sequence classifier with one label (config.json: one *ForSequenceClassification "
                     "architecture, num_labels 1)",
                     hint="point it at the checkpoints/final (or a checkpoints/step*) directory of an rw trial, or "
                          "at a reward model trained elsewhere in that Hugging Face form", site=True)
        return
    if not any((model / name).is_file() for name in TOKENIZER_FILES):
        problems.add(f"{FIELD}: '{path}' has no tokenizer (none of {', '.join(TOKENIZER_FILES)})",
                     hint="rw saves its tokenizer with the model: use a directory rw wrote" if form == VALUE_HEAD else
                          "save the reward model's tokenizer beside it (tokenizer.save_pretrained)", site=True)
    if form == VALUE_HEAD:  # a sequence classifier reads its own tokenizer's ids (rlkit.rewards.model_reward)
        _check_vocabulary(config, model, problems)


def _check_vocabulary(config: ExperimentConfig, model: Path, problems: Problems) -> None:
    """The reward model reads the policy's token ids: one vocabulary."""
    ours = _json(Path(config.actor.path) / "config.json").get("vocab_size")
    theirs = _json(model / "config.json").get("vocab_size")
    if ours is not None and theirs is not None and ours != theirs:
        problems.add(f"{FIELD}: the reward model's vocabulary ({theirs} tokens) is not the actor's ({ours}): it was "
                     "trained from another model family", hint="train the reward model from the actor's base model")
