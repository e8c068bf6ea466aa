"""The `sft` section: how rows of a supervised fine-tuning dataset become prompt and target tokens.

What the seeds already name lives where they put it: the datasets are `train_dataset` / `valid_dataset` with
`type: sft` and `max_length` (AReaL), the model, optimizer and micro-batch token budget are `actor`
(`actor.mb_spec.max_tokens_per_mb`), and epochs, saver and recover are the top-level fields every trainer reads. This
section holds only the row format, named after Trinity-RFT's dataset `format` keys; it applies to the training and
the validation set alike, so both must share their columns.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.config.schema.fields import _f

SFT_PROMPT_TYPES = ("plaintext", "messages")


@dataclass
class SFTConfig:
    """Job type sft: the loss is on the response (or assistant) tokens only."""

    prompt_type: str = _f("plaintext", "Row format. Choices: plaintext (a prompt column and a response column), "
                                       "messages (a column holding a chat: a list of {role, content}).")
    prompt_key: str = _f("prompt", "plaintext: column holding the prompt string.")
    response_key: str = _f("response", "plaintext: column holding the target response string.")
    system_prompt_key: str = _f("", "plaintext: column holding a per-row system prompt; empty: none.")
    system_prompt: str = _f("", "plaintext: system prompt for every row (system_prompt_key wins when both exist).")
    messages_key: str = _f("messages", "messages: column holding the chat; its assistant messages are the targets.")
    tools_key: str = _f(
        "tools", "Column holding a row's tools: a list of function schemas, or a JSON string of one, given to the "
                 "chat template as `tools` in every render of the row (messages rows, and plaintext rows through "
                 "the template). Default 'tools': the column TRL's SFTTrainer reads and Trinity-RFT's "
                 "format.tools_key default, so their tool-calling datasets train as they did there. A row without "
                 "the column (or null, empty) has no tools; a template that ignores tools is refused when a row "
                 "has them. Empty: no column is read.")
    enable_concatenated_multi_turn: bool = _f(
        False, "messages: train on every assistant message of a chat (true) or on its last one only (false).")
    apply_chat_template: bool = _f(
        True, "plaintext: wrap prompt and response in the tokenizer's chat template (false: the prompt text, then "
              "the response text and the EOS token, as a base model sees them). messages rows always use it.")
    chat_template: str = _f("", "A Jinja chat template used instead of the tokenizer's own; empty: the tokenizer's.")
    truncate: bool = _f(
        False, "Rows longer than the dataset's max_length: false drops them (AReaL), true cuts them to max_length "
               "(the end of the response is lost, so such rows never teach the model to stop).")


def sft_row_limit(max_length: int | None, max_tokens_per_mb: int | None) -> int | None:
    """The most tokens an sft row may have: the dataset's max_length, else the micro-batch budget (a longer row fits
    no micro-batch). Rows over it are dropped and counted in the trainer log, as rows over max_length are; AReaL's
    sft configs set no max_length."""
    return max_length if max_length is not None else max_tokens_per_mb
