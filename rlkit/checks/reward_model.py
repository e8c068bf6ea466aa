"""Submit-time checks of `reward.fn: reward_model` (torch-free): the directory is a reward model written by job type
rw, with a tokenizer, over the actor's vocabulary. A wrong directory would otherwise surface minutes into the job as
a reward of 0 for every completion (RewardRunner scores a failing call 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlkit import untrusted_json
from rlkit.checks.site_files import TOKENIZER_FILES
from rlkit.config.model_config import VALUE_HEAD_NOTE
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig

FIELD = "reward.reward_model_path"


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
    """Every problem of reward_model_path, given reward.fn."""
    from rlkit.rewards.model_reward import REWARD_MODEL

    path = config.reward.reward_model_path
    if config.reward.fn.strip() != REWARD_MODEL:
        if path:
            problems.add(f"{FIELD} is set, but reward.fn is {config.reward.fn!r}: it would be ignored",
                         hint=f"set reward.fn={REWARD_MODEL} to score with it, or remove {FIELD}")
        return
    if not path:
        return  # resolve_reward_fn reports it
    model = Path(path)
    if not model.is_dir():
        problems.add(f"{FIELD}: '{path}' is not a directory", hint="point it at an rw trial's checkpoints/final",
                     site=True)
        return
    note = _json(model / VALUE_HEAD_NOTE)
    if note.get("kind") != "reward":
        what = f"a {note['kind']} model" if note.get("kind") else f"no {VALUE_HEAD_NOTE}"
        problems.add(f"{FIELD}: '{path}' is not a reward model written by job type rw ({what})",
                     hint="point it at the checkpoints/final (or a checkpoints/step*) directory of an rw trial",
                     site=True)
        return
    if not any((model / name).is_file() for name in TOKENIZER_FILES):
        problems.add(f"{FIELD}: '{path}' has no tokenizer (none of {', '.join(TOKENIZER_FILES)})",
                     hint="rw saves its tokenizer with the model: use a directory rw wrote", site=True)
    ours = _json(Path(config.actor.path) / "config.json").get("vocab_size")
    theirs = _json(model / "config.json").get("vocab_size")
    if ours is not None and theirs is not None and ours != theirs:
        problems.add(f"{FIELD}: the reward model's vocabulary ({theirs} tokens) is not the actor's ({ours}): it was "
                     "trained from another model family", hint="train the reward model from the actor's base model")
