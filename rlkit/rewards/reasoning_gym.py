"""The `reasoning_gym` reward: the task's own `score_answer(answer, entry)` on the answer reasoning-gym's
`extract_answer` finds in the completion (the last <answer>...</answer>; none: scored as reasoning-gym scores None),
for rows made by rlkit.tasks.reasoning_gym. It runs in the reward workers like every reward.fn (timeouts, error
counts); reasoning-gym is imported there, never on the login node.

`answer_tag_reward` is a format reward to blend in (reward.fns) where a model cannot yet score on the task itself
(the CPU demo's random tiny model): it credits the <answer> tag, and partial progress towards writing it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from rlkit.tasks.reasoning_gym import CONFIG_KEY, TASK_KEY

NAME = "reasoning_gym"
SCORE_INFO = f"reward/{NAME}"  # a sample's info key of this function's value in a mix (rlkit.rewards.mix)
_OPEN, _CLOSE = "<answer>", "</answer>"
_scorers: dict[str, Callable[[str | None, dict[str, Any]], float]] = {}


def _scorer(task: str, task_config: dict[str, Any]) -> Callable[[str | None, dict[str, Any]], float]:
    """The task's score_answer, from a dataset built with the config the row was generated with (cached per
    worker: building one can take a while)."""
    key = json.dumps([task, task_config], sort_keys=True, default=str)
    if key not in _scorers:
        import reasoning_gym

        _scorers[key] = reasoning_gym.create_dataset(task, **{**task_config, "size": 1, "seed": 0}).score_answer
    return _scorers[key]


def reasoning_gym_reward(prompt: str, completion: str, row: dict[str, Any]) -> float:
    """The row's task's score of the completion's extracted answer (0.0..1.0, as reasoning-gym scores it)."""
    from reasoning_gym.utils import extract_answer

    if TASK_KEY not in row or "metadata" not in row:
        raise KeyError(f"reward.fn {NAME} scores rows generated from reasoning-gym (train_dataset.path "
                       f"reasoning-gym); this row has only {sorted(row)}")
    entry = {"question": row.get("question"), "answer": row.get("answer"), "metadata": row["metadata"]}
    return float(_scorer(str(row[TASK_KEY]), dict(row.get(CONFIG_KEY) or {}))(extract_answer(completion), entry))


def _warm() -> None:
    import reasoning_gym.utils  # noqa: F401  (the import takes ~2.5 s: not charged to the first call's timeout)


def make_reasoning_gym_reward(answer_key: str) -> partial[float]:
    """`reasoning_gym_reward` (the entry carries its answer: answer_key is not read)."""
    fn = partial(reasoning_gym_reward)
    fn.warmup = _warm  # type: ignore[attr-defined]
    return fn


def answer_tag_reward(prompt: str, completion: str, row: dict[str, Any]) -> float:
    """1.0 for a completion with a non-empty <answer>...</answer>; else half the longest start of "<answer>" it
    holds, as a fraction of the tag (0.0 for none): a gradient a random model can climb towards the format."""
    start = completion.find(_OPEN)
    if start >= 0:
        end = completion.find(_CLOSE, start + len(_OPEN))
        if end > start + len(_OPEN) and completion[start + len(_OPEN):end].strip():
            return 1.0
    longest = max((n for n in range(1, len(_OPEN) + 1) if _OPEN[:n] in completion), default=0)
    return 0.5 * longest / len(_OPEN)


def task_metrics(scored: Iterable[tuple[Any, Iterable[Any]]], prefix: str = "reward") -> dict[str, float]:
    """<prefix>/task/<task>/mean: each reasoning-gym task's mean score over (row, samples) pairs, a batch's groups or
    an evaluation's prompts (rows of other sources have no task and are left out). The task's own score where
    reward.fns blends it with others, else the sample's reward."""
    by_task: dict[str, list[float]] = {}
    for row, samples in scored:
        task = row.get(TASK_KEY) if isinstance(row, dict) else None
        if isinstance(task, str):
            by_task.setdefault(task, []).extend(float(s.info.get(SCORE_INFO, s.reward)) for s in samples)
    return {f"{prefix}/task/{task}/mean": sum(v) / len(v) for task, v in sorted(by_task.items()) if v}
