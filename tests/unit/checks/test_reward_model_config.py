"""`reward.fn: reward_model` at submit: the field pair is checked, torch-free, with every mistake named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.checks.reward_model import VALUE_HEAD_NOTE, validate_reward_model
from rlkit.config.load import config_from_mapping
from rlkit.config.problems import Problems
from rlkit.errors import ConfigError
from rlkit.rewards import resolve_reward_fn


def _model_dir(path: Path, *, kind: str | None, vocab: int = 100, tokenizer: bool = True) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"vocab_size": vocab}))
    if kind is not None:
        (path / VALUE_HEAD_NOTE).write_text(json.dumps({"kind": kind}))
    if tokenizer:
        (path / "tokenizer.json").write_text("{}")
    return path


def _problems(tmp_path: Path, reward: dict[str, str]) -> list[str]:
    actor = tmp_path / "actor"
    if not actor.exists():
        _model_dir(actor, kind=None)
    config = config_from_mapping({"experiment_name": "e", "trial_name": "t", "type": "grpo",
                                  "allocation_mode": "vllm:d1+fsdp:d1",
                                  "actor": {"path": str(actor)}, "reward": reward})
    problems = Problems()
    validate_reward_model(config, problems)
    return [e.message for e in problems.errors]


def test_a_reward_model_of_the_actors_vocabulary_passes(tmp_path: Path) -> None:
    rm = _model_dir(tmp_path / "rm", kind="reward")
    assert _problems(tmp_path, {"fn": "reward_model", "reward_model_path": str(rm)}) == []


@pytest.mark.parametrize(("kind", "vocab", "tokenizer", "says"), [
    (None, 100, True, "is neither a reward model written by job type rw (no rlkit_value_head.json) nor a Hugging "
                      "Face sequence classifier with one label"),
    ("critic", 100, True, "is neither a reward model written by job type rw (a critic model)"),
    ("reward", 100, False, "has no tokenizer"),
    ("reward", 151936, True, "the reward model's vocabulary (151936 tokens) is not the actor's (100)"),
])
def test_a_wrong_directory_is_named(tmp_path: Path, kind: str | None, vocab: int, tokenizer: bool, says: str) -> None:
    rm = _model_dir(tmp_path / "rm", kind=kind, vocab=vocab, tokenizer=tokenizer)
    found = _problems(tmp_path, {"fn": "reward_model", "reward_model_path": str(rm)})
    assert len(found) == 1 and says in found[0], found


def test_the_path_without_the_function_and_the_function_without_the_path(tmp_path: Path) -> None:
    rm = _model_dir(tmp_path / "rm", kind="reward")
    assert "is set, but reward.fn is 'math': it would be ignored" in _problems(
        tmp_path, {"fn": "math", "reward_model_path": str(rm)})[0]
    with pytest.raises(ConfigError, match=r"is reward_model but reward\.reward_model_path is empty"):
        resolve_reward_fn("reward_model", "answer", "")
    with pytest.raises(ConfigError, match="reward_model"):  # listed among the built-ins
        resolve_reward_fn("no_such_reward", "answer")
    fn = resolve_reward_fn("reward_model", "answer", str(rm))
    assert callable(fn) and callable(getattr(fn, "warmup", None))  # the model loads in the worker, not here


def test_a_mix_with_reward_model_takes_the_path_and_one_without_it_is_told(tmp_path: Path) -> None:
    rm = _model_dir(tmp_path / "rm", kind="reward")
    assert _problems(tmp_path, {"fns": {"reward_model": 1.0, "math": 0.5}, "reward_model_path": str(rm)}) == []
    found = _problems(tmp_path, {"fns": {"math": 1.0}, "reward_model_path": str(rm)})
    assert len(found) == 1 and "reward.fns lists no reward_model: it would be ignored" in found[0], found


def test_a_reward_model_not_written_yet_is_checked_as_the_model_its_rw_stage_starts_from(tmp_path: Path) -> None:
    """An rw stage's final, handed over in a multi-stage run (rlkit.launch.stage_reward): its vocabulary is the
    stand-in's (the model rw trains from); outside the run, the same missing path is refused."""
    from rlkit.checks.reward_model import pending_reward_model

    pending = str(tmp_path / "run_rm" / "checkpoints" / "final")
    same, other = _model_dir(tmp_path / "base", kind=None), _model_dir(tmp_path / "other", kind=None, vocab=7)
    reward = {"fn": "reward_model", "reward_model_path": pending}
    with pending_reward_model(pending, str(same)):
        assert _problems(tmp_path, reward) == []
    with pending_reward_model(pending, str(other)):
        found = _problems(tmp_path, reward)
    assert len(found) == 1 and "the reward model's vocabulary (7 tokens) is not the actor's (100)" in found[0], found
    assert "is not a directory" in _problems(tmp_path, reward)[0]
