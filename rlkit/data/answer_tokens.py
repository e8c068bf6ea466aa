"""A prompt and its answer as tokens (torch-free): the prompt tokenized once, the answer as the tokens that follow it.

Chat prompts (a list of messages) go through the tokenizer's chat template with the generation prompt; a chat answer
is what the template adds after it, so its closing tokens (end of turn) are part of the answer. A plain-text answer
gets the end-of-sequence token appended. Preference pairs (rlkit.jobs.pairs.data) and the reward model's scoring
(rlkit.rewards.model_reward) both split sequences this way, so a reward model scores what it was trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlkit.errors import StepError


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "content" in m for m in value)


def chat_ids(tokenizer: Any, messages: list[dict[str, Any]], *, generation_prompt: bool) -> list[int]:
    # return_dict=False: transformers 5 returns a BatchEncoding (a dict) by default
    try:
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt,
                                            return_dict=False)
    except ValueError as exc:  # transformers: no chat template set (or one that cannot render these messages)
        raise StepError(f"the tokenizer cannot render this chat: {exc}") from None
    return [int(t) for t in ids]


def prompt_ids(tokenizer: Any, prompt: Any) -> list[int]:
    """The tokens of a prompt: a string as it is, chat messages through the template with the generation prompt."""
    if isinstance(prompt, str):
        return [int(t) for t in tokenizer.encode(prompt, add_special_tokens=False)]
    if _is_messages(prompt):
        return chat_ids(tokenizer, prompt, generation_prompt=True)
    raise StepError(f"cannot read a prompt of type {type(prompt).__name__}: give a string or chat messages")


def answer_ids(tokenizer: Any, prompt: Any, answer: Any, prompt_tokens: Sequence[int]) -> list[int]:
    """The tokens that follow `prompt_tokens` for `answer`: a string prompt takes a string answer (+ end of
    sequence); chat messages take a string (one assistant message) or the assistant message(s) that follow."""
    if isinstance(prompt, str):
        if not isinstance(answer, str):
            raise StepError(f"a text prompt needs a text answer, got {type(answer).__name__}")
        if tokenizer.eos_token_id is None:
            raise StepError("the tokenizer has no end-of-sequence token, which ends every text answer")
        return [int(t) for t in tokenizer.encode(answer, add_special_tokens=False)] + [int(tokenizer.eos_token_id)]
    turns = [{"role": "assistant", "content": answer}] if isinstance(answer, str) else answer
    if not _is_messages(turns):
        raise StepError(f"a chat prompt needs a string or chat messages as answer, got {type(answer).__name__}")
    full = chat_ids(tokenizer, [*prompt, *turns], generation_prompt=False)
    if full[: len(prompt_tokens)] != list(prompt_tokens):
        raise StepError("the tokenizer's chat template does not render the prompt (with its generation prompt) as "
                        "the start of prompt + answer, so the answer's tokens cannot be told apart")
    return full[len(prompt_tokens):]
