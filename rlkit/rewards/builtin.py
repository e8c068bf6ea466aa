"""Built-in rewards: `math` (the final answer checked with math-verify) and `exact_match`.

Both read the reference answer (or a list of accepted ones) from the row's `answer_key`, a column or a dotted path
through nested fields (verl's `reward_model.ground_truth`: rlkit.data.row_field); `resolve_reward_fn` binds the key
with functools.partial, which keeps them picklable for the reward worker processes. math-verify is imported on first
use (it is a trainer extra, not needed on the login node) and is called with its signal-based timeouts off, so it
works in any thread; the time limit is enforced by `RewardRunner`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from functools import partial
from types import ModuleType
from typing import Any

from rlkit.data.row_field import MISSING, row_field, where_missing
from rlkit.data.row_formats import final_answer

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# 1,234.5  -3  .5  12/7 ; a '-' is a sign only when it does not follow a word or ')' (so "5-3" ends in 3, not -3).
_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:/\d+)?")
_math_verify: ModuleType | None = None


def last_boxed(text: str) -> str | None:
    """The content of the last closed \\boxed{...} (or \\fbox{...}) in `text`, or None."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i]
    return None


def last_number(text: str) -> str | None:
    """The last number in `text` ("1,000" as "1000", "3/4" kept as a fraction), or None."""
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def extract_answer(completion: str) -> str | None:
    """The completion's final answer: the last \\boxed{...} if any, else the last number."""
    boxed = last_boxed(completion)
    return boxed if boxed is not None else last_number(completion)


def reference_answers(row: dict[str, Any], answer_key: str) -> list[str]:
    """The row's acceptable answers at `answer_key` (a column, or a path through nested fields: rlkit.data.row_field),
    each a stripped string (of a GSM8K worked solution, its final answer: rlkit.data.row_formats): one for a text or
    a number, each element of a list (QA sets list every accepted form: a completion matching any of them scores).
    A KeyError names the key, where the row lacks it and the row's columns. A null answer, an empty list and an object
    (reward_model without its ground_truth) are none: scored against the text "None", "[]" or "{...}" each would be a
    silent 0.0 for every completion."""
    gold = row_field(row, answer_key)
    if gold is MISSING or gold is None:
        raise KeyError(f"the dataset row has no answer at {answer_key!r} (reward.answer_key): "
                       f"{where_missing(row, answer_key)}; its columns: {sorted(row)}")
    if isinstance(gold, Mapping):
        raise KeyError(f"the dataset row's {answer_key!r} (reward.answer_key) is an object (its keys: "
                       f"{', '.join(str(k) for k in gold)[:200]}), not an answer: name the field inside it")
    golds = list(gold) if isinstance(gold, (list, tuple)) else [gold]
    if not golds:
        raise KeyError(f"the dataset row's {answer_key!r} (reward.answer_key) is an empty list: no answer to match")
    for one in golds:
        if one is None or not isinstance(one, (str, int, float)):
            kind = "null" if one is None else f"a {type(one).__name__}"
            raise KeyError(f"the dataset row's {answer_key!r} (reward.answer_key) is a list holding {kind}: each "
                           "element must be an accepted answer (a text or a number)")
    return [final_answer(str(one)) for one in golds]


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once per process that its timeout is off; here that is intended (RewardRunner times calls)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


def load_math_verify() -> ModuleType:
    """Import math_verify once, silencing its timeout-disabled warning."""
    global _math_verify
    if _math_verify is None:
        import math_verify

        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())
        _math_verify = math_verify
    return _math_verify


def _parse(mv: ModuleType, answer: str) -> list[Any]:
    # Wrapping in \boxed{} makes math-verify read bare LaTeX (\frac12, 2^{10}) and plain numbers alike.
    return list(mv.parse(f"\\boxed{{{answer}}}", parsing_timeout=None))


def math_reward(prompt: str, completion: str, row: dict[str, Any], answer_key: str = "answer") -> float:
    """1.0 when the completion's final answer equals one of `row[answer_key]`'s answers mathematically
    (math-verify), else 0.0."""
    golds = reference_answers(row, answer_key)
    answer = extract_answer(completion)
    if answer is None or not answer.strip():
        return 0.0
    mv = load_math_verify()
    answer_parsed = _parse(mv, answer)
    if not answer_parsed:
        return 0.0
    for gold in golds:
        gold_parsed = _parse(mv, last_boxed(gold) or gold) if gold else []
        if gold_parsed and mv.verify(gold_parsed, answer_parsed, timeout_seconds=None):
            return 1.0
    return 0.0


def exact_match_reward(prompt: str, completion: str, row: dict[str, Any], answer_key: str = "answer") -> float:
    """1.0 when the stripped completion, or the content of its last \\boxed{}, equals one of the stripped answers,
    else 0.0."""
    golds = reference_answers(row, answer_key)
    boxed = last_boxed(completion)
    said = {completion.strip()} | ({boxed.strip()} if boxed is not None else set())
    return 1.0 if said & set(golds) else 0.0


def warm_math_verify() -> None:
    """Import math-verify and run one check, so a worker's first call is not slowed by the import."""
    mv = load_math_verify()
    mv.verify(_parse(mv, "1"), _parse(mv, "1"), timeout_seconds=None)


def make_math_reward(answer_key: str) -> partial[float]:
    """`math_reward` bound to `answer_key`; `warmup` is run by the reward worker before its first call."""
    fn = partial(math_reward, answer_key=answer_key)
    fn.warmup = warm_math_verify  # type: ignore[attr-defined]
    return fn


def make_exact_match_reward(answer_key: str) -> partial[float]:
    """`exact_match_reward` bound to `answer_key`."""
    return partial(exact_match_reward, answer_key=answer_key)


def no_reward(prompt: str, completion: str, row: dict[str, Any]) -> float:
    """0.0 for everything: a run whose loss needs no reward (job type distill with distill.rl_coef 0)."""
    return 0.0


def make_no_reward(answer_key: str) -> partial[float]:
    """`no_reward` (it reads no answer column)."""
    return partial(no_reward)


def make_reasoning_gym(answer_key: str) -> partial[float]:
    """The reasoning-gym task's own score (rlkit.rewards.reasoning_gym; imported here only when named)."""
    from rlkit.rewards.reasoning_gym import make_reasoning_gym_reward

    return make_reasoning_gym_reward(answer_key)


BUILTINS = {"math": make_math_reward, "exact_match": make_exact_match_reward, "none": make_no_reward,
            "reasoning_gym": make_reasoning_gym}
