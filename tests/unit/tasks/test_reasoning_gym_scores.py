"""rlkit's reasoning-gym reward against reasoning-gym's own scoring, over every task it generates offline: rows made
by rlkit's dataset source, scored through rlkit's reward path (extraction, the task's scorer built from the row,
the reward worker's number check) must give what the generating dataset's own `score_answer` gives, for the gold
answer written as the prompt asks (<answer>...</answer>) and for a wrong one."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

reasoning_gym = pytest.importorskip("reasoning_gym")  # the optional extra (rlkit[reasoning-gym])

from reasoning_gym.factory import DATASETS  # noqa: E402
from reasoning_gym.utils import SYSTEM_PROMPTS  # noqa: E402

from rlkit.config.schema.reasoning_gym import ReasoningGymConfig  # noqa: E402
from rlkit.rewards.builtin import BUILTINS  # noqa: E402
from rlkit.rewards.runner import as_reward  # noqa: E402
from rlkit.tasks import reasoning_gym_names  # noqa: E402
from rlkit.tasks.reasoning_gym import generate_rows  # noqa: E402

WRONG = "definitely not the answer 7e13"
ROWS = 2


def test_pinned_names_are_the_installed_ones() -> None:
    assert reasoning_gym.__version__ and sorted(DATASETS) == list(reasoning_gym_names.TASKS)
    assert set(SYSTEM_PROMPTS) == set(reasoning_gym_names.SYSTEM_PROMPTS)
    import importlib.metadata

    assert importlib.metadata.version("reasoning-gym") == reasoning_gym_names.VERSION


def _score(fn: Callable[..., object], *args: object) -> object:
    """A score, or the type of the exception raised instead (reasoning-gym's scorers may raise on a malformed
    answer; rlkit's reward worker then counts an error and scores 0)."""
    try:
        return as_reward(fn(*args))
    except Exception as exc:
        return type(exc)


@pytest.mark.parametrize("task", [t for t in reasoning_gym_names.TASKS if t != reasoning_gym_names.COMPOSITE])
def test_scores_agree_with_reasoning_gym(task: str) -> None:
    started = time.monotonic()
    section = ReasoningGymConfig(size=ROWS, seed=3, system_prompt="default")
    rows = generate_rows(section, f"reasoning-gym:{task}", valid=False)
    own = reasoning_gym.create_dataset(task, size=ROWS, seed=section.seed + 1)  # the seed composite gives task 0
    reward = BUILTINS["reasoning_gym"]("answer")
    assert len(rows) == ROWS
    for i, row in enumerate(rows):
        entry = own[i]
        assert row["question"] == entry["question"] and row["task"] == task
        assert row["prompt"][0]["content"] == SYSTEM_PROMPTS["default"]
        assert row["prompt"][-1] == {"role": "user", "content": entry["question"]}
        if entry["answer"] is not None:  # rubiks_cube, rush_hour: no single gold answer, scored by simulation
            gold = f"Thinking it over.\n<answer>{entry['answer']}</answer>"
            assert _score(reward, "p", gold, row) == _score(own.score_answer, entry["answer"], entry)
        wrong = f"<answer>{WRONG}</answer>"
        assert _score(reward, "p", wrong, row) == _score(own.score_answer, WRONG, entry)
        assert _score(reward, "p", "no tags at all", row) == _score(own.score_answer, None, entry)
    assert time.monotonic() - started < 30  # generating and scoring a few rows stays quick for every task
