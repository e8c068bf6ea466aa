"""GSM8K's row form, read as AReaL reads its built-in GSM8K dataset, so AReaL's GSM8K examples need no column
settings: rows `{"question": ..., "answer": "<worked solution>\\n#### 42"}`.

The decision is made here once, for the submit-time checks and for the steps that turn rows into prompts alike:
rows are GSM8K's when the column setting is left at rlkit's default (`prompt`; sft: `prompt`/`response`), the rows
have no such column, and they have `question` and `answer`. Then
- an rl prompt (grpo, ppo, evaluation, generate) is one user chat message: the question and an instruction to box
  the final answer (what AReaL's GSM8K prompts ask; the `math` reward reads a boxed answer first);
- an sft row is the question as prompt and the whole answer as response;
- and wherever a reference answer is read, a GSM8K answer counts for what follows its last `####` (rlkit.rewards).
Pair rows (rw, dpo) in hh-rlhf's form, whole conversations `{"chosen": "\n\nHuman: ...\n\nAssistant: ...",
"rejected": ...}` with no prompt column, are split the same way: the prompt is the conversation both share up to
its last `Assistant:` turn, the answers what follows in each.
An explicit column setting always wins: a prompt_key the rows lack stays an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

DEFAULT_PROMPT_KEY = "prompt"
DEFAULT_RESPONSE_KEY = "response"
GSM8K_COLUMNS = ("question", "answer")
BOX_INSTRUCTION = "\nPut your final answer in \\boxed{}."
ANSWER_MARK = "####"
ASSISTANT_TURN = "\n\nAssistant:"


def is_gsm8k_row(row: Mapping[str, Any], prompt_key: str) -> bool:
    """Whether rows like `row`, read with `prompt_key`, are GSM8K's (see the module docstring)."""
    return (prompt_key == DEFAULT_PROMPT_KEY and DEFAULT_PROMPT_KEY not in row
            and all(isinstance(row.get(column), str) for column in GSM8K_COLUMNS))


def rl_prompt(row: Mapping[str, Any], prompt_key: str) -> Any:
    """The prompt of an rl row: `row[prompt_key]`, or for a GSM8K row the question as one user message that asks
    for a boxed answer. KeyError when the row has neither."""
    if is_gsm8k_row(row, prompt_key):
        return [{"role": "user", "content": str(row["question"]) + BOX_INSTRUCTION}]
    return row[prompt_key]


def sft_columns(row: Mapping[str, Any], prompt_key: str, response_key: str) -> tuple[str, str]:
    """The prompt and response columns of an sft row: the configured ones, or GSM8K's question and answer when both
    settings are left at their defaults and the row is GSM8K's."""
    if response_key == DEFAULT_RESPONSE_KEY and DEFAULT_RESPONSE_KEY not in row and is_gsm8k_row(row, prompt_key):
        return GSM8K_COLUMNS
    return prompt_key, response_key


def final_answer(gold: str) -> str:
    """A reference answer as given, or for GSM8K's worked solution what follows its last `####`, with the thousands
    separators GSM8K writes ("1,000") dropped."""
    if ANSWER_MARK not in gold:
        return gold.strip()
    return gold.rsplit(ANSWER_MARK, 1)[1].strip().replace(",", "")


def pair_row(row: Mapping[str, Any], prompt_key: str, chosen_key: str, rejected_key: str) -> Mapping[str, Any]:
    """A pair row as rlkit reads it: `row`, or for an hh-rlhf conversation pair (prompt_key left at its default,
    no such column, two text answers sharing a beginning that ends in an Assistant turn) the row with the shared
    beginning as `prompt_key` and each answer cut after it."""
    chosen, rejected = row.get(chosen_key), row.get(rejected_key)
    if prompt_key != DEFAULT_PROMPT_KEY or prompt_key in row or not (isinstance(chosen, str)
                                                                       and isinstance(rejected, str)):
        return row
    shortest = min(len(chosen), len(rejected))
    same = next((i for i in range(shortest) if chosen[i] != rejected[i]), shortest)
    shared = chosen[:same]
    cut = shared.rfind(ASSISTANT_TURN)
    if cut < 0:
        return row
    end = cut + len(ASSISTANT_TURN)
    return {**row, prompt_key: chosen[:end], chosen_key: chosen[end:], rejected_key: rejected[end:]}


def has_prompt(columns: Sequence[str], first_row: Callable[[Sequence[str]], Mapping[str, Any] | None],
               prompt_key: str) -> bool:
    """Whether an rl dataset with these columns has its prompts: the `prompt_key` column, or GSM8K's rows, judged by
    the first row's `question` and `answer` (`first_row(columns)` reads them; a dataset with no rows passes)."""
    if prompt_key in columns:
        return True
    if prompt_key != DEFAULT_PROMPT_KEY or not all(column in columns for column in GSM8K_COLUMNS):
        return False
    row = first_row(GSM8K_COLUMNS)
    return row is None or is_gsm8k_row(row, prompt_key)
