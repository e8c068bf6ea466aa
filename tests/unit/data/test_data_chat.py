"""Chat prompts become token ids (rlkit.data.files), with the tiny model's real tokenizer and chat template."""

from __future__ import annotations

from pathlib import Path

from rlkit.data.files import prompt_token_ids


def test_chat_prompts_tokenize_to_ids(tiny_model_dir: Path) -> None:
    """transformers 5 returns a BatchEncoding from apply_chat_template by default: its list() is its keys."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    wrapped = prompt_token_ids("1+2?", tokenizer, chat_template=True)
    messages = prompt_token_ids([{"role": "user", "content": "1+2?"}], tokenizer, chat_template=False)
    assert wrapped == messages and all(isinstance(t, int) for t in wrapped)
    assert tokenizer.decode(wrapped) == "<|im_start|>user\n1+2?<|im_end|>\n<|im_start|>assistant\n"
