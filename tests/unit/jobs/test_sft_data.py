"""SFT rows -> token ids and loss masks, with the tiny model's real tokenizer (as vLLM and the trainer load it)."""

from __future__ import annotations

from typing import Any

import pytest

from rlkit.config.schema.sft import SFTConfig
from rlkit.errors import StepError
from rlkit.jobs.sft.data import (
    SFTExample,
    chat_example,
    fit_length,
    micro_batches,
    plaintext_example,
    rank_micro_batches,
    rank_share,
    row_example,
    tokenize_rows,
)

CHAT = [
    {"role": "system", "content": "Answer with digits."},
    {"role": "user", "content": "Q: 2+3= A:"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "and 4+4?"},
    {"role": "assistant", "content": "8"},
]
# A template that adds a default system message when the chat has none (as Qwen2.5's does) ...
DEFAULT_SYSTEM_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# ... one with the BOS token in the text and plain-text turn markers (no EOS token in the turn) ...
PLAIN_MARKER_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '[' + m['role'] + ']\\n' + m['content'] + ' [end]\\n\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '[assistant]\\n' }}{% endif %}"
)
# ... and one that shortens earlier assistant turns (as templates that drop earlier reasoning do).
REWRITING_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
    "{{ '<|im_start|>assistant\\n' + m['content'][:1] + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# ... and one whose generation prompt opens a reasoning block that a written assistant message does not have.
THINKING_PROMPT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)


def spans(tok: Any, ex: SFTExample) -> list[str]:
    """The decoded runs of target tokens, in order."""
    runs: list[list[int]] = []
    for i, (token, m) in enumerate(zip(ex.input_ids, ex.loss_mask, strict=True)):
        if m and (i == 0 or not ex.loss_mask[i - 1]):
            runs.append([])
        if m:
            runs[-1].append(token)
    return [tok.decode(r) for r in runs]


def test_raw_plaintext_masks_the_response_and_eos_only(tok: Any) -> None:
    ex = plaintext_example("Q: 2+3= A:", " 5", tok, apply_chat_template=False)
    prompt = tok.encode("Q: 2+3= A:", add_special_tokens=False)
    response = tok.encode(" 5", add_special_tokens=False)
    assert ex.input_ids == prompt + response + [tok.eos_token_id]
    assert ex.loss_mask == [0] * len(prompt) + [1] * (len(response) + 1)
    assert spans(tok, ex) == [" 5<|im_end|>"]


def test_chat_plaintext_trains_the_assistant_turn_and_keeps_the_inference_prompt(tok: Any) -> None:
    ex = plaintext_example("Q: 2+3= A:", "5", tok, apply_chat_template=True, system_prompt="Be brief.")
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: 2+3= A:"}]
    prompt = tok.encode(tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)
    assert ex.input_ids[: len(prompt)] == prompt and not any(ex.loss_mask[: len(prompt)])
    assert spans(tok, ex) == ["5<|im_end|>"]
    assert tok.decode(ex.input_ids[len(prompt) + 2 :]) == "\n"  # the separator after the turn is context


def test_multi_turn_chat_last_or_every_assistant_message(tok: Any) -> None:
    whole = tok.encode(tok.apply_chat_template(CHAT, tokenize=False), add_special_tokens=False)
    last = chat_example(CHAT, tok, all_turns=False)
    every = chat_example(CHAT, tok, all_turns=True)
    assert last.input_ids == whole and every.input_ids == whole  # the tokenizer's own encoding of the chat
    assert spans(tok, last) == ["8<|im_end|>"]
    assert spans(tok, every) == ["5<|im_end|>", "8<|im_end|>"]


@pytest.mark.parametrize(("template", "expected"), [
    (DEFAULT_SYSTEM_TEMPLATE, ["5<|im_end|>", "8<|im_end|>"]),
    (PLAIN_MARKER_TEMPLATE, ["5 [end]\n\n", "8 [end]\n\n"]),
])
def test_other_templates_give_exact_assistant_spans(tok: Any, template: str, expected: list[str]) -> None:
    chat = CHAT[1:]  # no system message: the first template adds its own
    ex = chat_example(chat, tok, all_turns=True, chat_template=template)
    assert spans(tok, ex) == expected
    assert tok.decode(ex.input_ids) == tok.apply_chat_template(chat, tokenize=False, chat_template=template)


def test_a_template_that_rewrites_earlier_turns_is_refused_for_every_turn_but_works_for_the_last(tok: Any) -> None:
    chat = [*CHAT[:2], {"role": "assistant", "content": "55"}, *CHAT[3:]]
    with pytest.raises(ValueError, match="enable_concatenated_multi_turn=false"):
        chat_example(chat, tok, all_turns=True, chat_template=REWRITING_TEMPLATE)
    assert spans(tok, chat_example(chat, tok, all_turns=False, chat_template=REWRITING_TEMPLATE)) == ["8<|im_end|>"]
    with pytest.raises(ValueError, match="generation prompt is not the start of assistant message 4"):
        chat_example(CHAT, tok, all_turns=False, chat_template=THINKING_PROMPT_TEMPLATE)


@pytest.mark.parametrize(("row", "message"), [
    ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
    ({"messages": "hi"}, "non-empty list"),
    ({"messages": [{"role": "assistant"}]}, "message 0"),
    ({"chat": []}, "no column 'messages'"),
])
def test_bad_chat_rows_are_refused_naming_the_problem(tok: Any, row: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        row_example(row, tok, SFTConfig(prompt_type="messages"))


def test_plaintext_row_columns_and_system_prompt_key(tok: Any) -> None:
    sft = SFTConfig(prompt_key="q", response_key="a", system_prompt_key="sys", system_prompt="default")
    ex = row_example({"q": "Q: 1+1= A:", "a": "2", "sys": "Be brief."}, tok, sft)
    assert "Be brief." in tok.decode(ex.input_ids) and "default" not in tok.decode(ex.input_ids)
    assert "default" in tok.decode(row_example({"q": "Q: 1+1= A:", "a": "2"}, tok, sft).input_ids)
    with pytest.raises(StepError, match=r"train\.jsonl: row 1: column 'a' \(sft.response_key\)"):
        tokenize_rows([{"q": "x", "a": "y"}, {"q": "x"}], tok, sft, max_length=None, source="train.jsonl")


def test_max_length_drops_or_truncates() -> None:
    ex = SFTExample([1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1])
    assert fit_length(ex, 6, truncate=False) is ex
    assert fit_length(ex, 5, truncate=False) is None
    assert fit_length(ex, 5, truncate=True) == SFTExample([1, 2, 3, 4, 5], [0, 0, 0, 1, 1])
    assert fit_length(ex, 3, truncate=True) is None  # cutting would leave no target token


def test_tokenize_rows_counts_dropped_and_truncated_rows(tok: Any) -> None:
    rows = [{"prompt": "Q: 1+1= A:", "response": " 2"}, {"prompt": "Q: 1+1= A:", "response": " 2" * 20}]
    sft = SFTConfig(apply_chat_template=False)
    kept = tokenize_rows(rows, tok, sft, max_length=16)
    assert (len(kept.examples), kept.dropped, kept.truncated) == (1, 1, 0)
    sft.truncate = True
    cut = tokenize_rows(rows, tok, sft, max_length=16)
    assert (len(cut.examples), cut.dropped, cut.truncated) == (2, 0, 1)
    assert cut.examples[1].length == 16


def test_micro_batches_first_fit_decreasing_within_the_padded_budget() -> None:
    lengths = [10, 9, 5, 5, 2]
    assert micro_batches(range(5), lengths, max_tokens=20) == [[0, 1], [2, 3, 4]]
    for budget in (10, 12, 25, 40):
        mbs = micro_batches(range(5), lengths, max_tokens=budget)
        assert sorted(i for mb in mbs for i in mb) == [0, 1, 2, 3, 4]
        assert all(len(mb) * max(lengths[i] for i in mb) <= budget for mb in mbs)
    assert len(micro_batches(range(5), lengths, max_tokens=100, n_mbs=3)) == 3
    assert micro_batches(range(5), lengths, max_tokens=None, n_mbs=2) == [[0, 2, 4], [1, 3]]
    with pytest.raises(ValueError, match="10 tokens exceeds the micro-batch budget of 9"):
        micro_batches(range(5), lengths, max_tokens=9)


def test_rank_share_balances_tokens() -> None:
    lengths = [8, 7, 6, 5, 4, 3, 2, 1]
    shares = rank_share(range(8), lengths, 2)
    assert sorted(shares[0] + shares[1]) == list(range(8))
    assert sum(lengths[i] for i in shares[0]) == sum(lengths[i] for i in shares[1]) == 18
    assert rank_share([0], lengths, 2) == [[0], []]


def test_every_rank_agrees_on_the_micro_batch_count_without_a_collective() -> None:
    # rank 0 gets the 4-token row (4 tokens), rank 1 the 3- and 1-token rows (4 tokens), which cost 2 x 3 > 4
    # padded tokens together, so they go into two micro-batches and rank 0 adds one dummy
    lengths = [4, 3, 1]
    assert rank_micro_batches([0, 1, 2], lengths, rank=0, world=2, max_tokens=4) == ([[0]], 1)
    assert rank_micro_batches([0, 1, 2], lengths, rank=1, world=2, max_tokens=4) == ([[1], [2]], 0)
    assert rank_micro_batches([0, 1, 2], lengths, rank=0, world=1, max_tokens=4) == ([[0], [1], [2]], 0)
