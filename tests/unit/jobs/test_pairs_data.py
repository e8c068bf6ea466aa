"""Pairs as tokens with the tiny model's real tokenizer: shared prompt, exact answer masks (text and chat rows),
and length limits; packing into the chosen/rejected layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rlkit.data.files import prompt_token_ids
from rlkit.errors import StepError
from rlkit.jobs.pairs.batch import pack_pairs, split_pairs
from rlkit.jobs.pairs.data import Pair, build_pairs, encode_pair, fit_length, pairs_from_rows

KEYS = {"prompt_key": "prompt", "chosen_key": "chosen", "rejected_key": "rejected"}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_text_row_shares_the_prompt_and_masks_exactly_the_answer(tokenizer: Any) -> None:
    pair = encode_pair(tokenizer, {"prompt": "Q: 1+2= A:", "chosen": " 3", "rejected": " c"}, 5, **KEYS)
    prompt = tokenizer.encode("Q: 1+2= A:", add_special_tokens=False)
    assert pair.index == 5 and list(pair.prompt_ids) == prompt
    assert list(pair.chosen_ids) == [*tokenizer.encode(" 3", add_special_tokens=False), tokenizer.eos_token_id]
    ids, mask = pair.sequence("rejected")
    assert ids == prompt + list(pair.rejected_ids)
    assert mask == [False] * len(prompt) + [True] * len(pair.rejected_ids)
    assert tokenizer.decode(pair.rejected_ids) == " c<|im_end|>"


def test_chat_row_answer_is_what_the_template_adds(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "1+2?"}]
    as_text = encode_pair(tokenizer, {"prompt": messages, "chosen": "3", "rejected": "three"}, 0, **KEYS)
    as_turns = encode_pair(tokenizer, {"prompt": messages, "chosen": [{"role": "assistant", "content": "3"}],
                                       "rejected": [{"role": "assistant", "content": "three"}]}, 0, **KEYS)
    assert as_text == as_turns
    assert tokenizer.decode(as_text.prompt_ids).endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(as_text.chosen_ids) == "3<|im_end|>\n"
    assert list(as_text.prompt_ids) == prompt_token_ids(messages, tokenizer, chat_template=True)


def test_unreadable_rows_name_the_row_and_the_problem(tokenizer: Any) -> None:
    with pytest.raises(StepError, match="row 4: no column 'rejected'"):
        encode_pair(tokenizer, {"prompt": "a", "chosen": "b"}, 4, **KEYS)
    with pytest.raises(StepError, match="row 1: a text prompt needs a text answer"):
        encode_pair(tokenizer, {"prompt": "a", "chosen": [{"role": "assistant", "content": "b"}], "rejected": "c"},
                    1, **KEYS)


class PrefixBreakingTemplate:
    """A tokenizer whose chat template renders the prompt differently once an answer follows."""

    eos_token_id = 0

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> list[int]:
        return [len(messages)] * (len(messages) + 1)


def test_a_template_that_does_not_prefix_the_prompt_is_refused() -> None:
    row = {"prompt": [{"role": "user", "content": "q"}], "chosen": "a", "rejected": "b"}
    with pytest.raises(StepError, match="does not render the prompt"):
        encode_pair(PrefixBreakingTemplate(), row, 0, **KEYS)


def test_pairs_from_rows_reads_the_configured_columns(tokenizer: Any) -> None:
    from rlkit.config.schema.experiment import DatasetConfig
    from rlkit.config.schema.pairs import DPOConfig

    rows = [{"q": "Q: 1+1= A:", "good": " 2", "bad": " b"}]
    section = DPOConfig(chosen_key="good", rejected_key="bad")
    pairs, counts = pairs_from_rows(rows, DatasetConfig(path="p.jsonl", prompt_key="q"), section, tokenizer)
    assert counts.kept == 1 and tokenizer.decode(pairs[0].chosen_ids) == " 2<|im_end|>"
    with pytest.raises(StepError, match="none of its 1 rows is a usable pair"):
        pairs_from_rows(rows, DatasetConfig(path="p.jsonl", prompt_key="q", max_length=3), section, tokenizer)


def test_length_limit_drops_or_cuts_the_prompt_from_the_left() -> None:
    pair = Pair(0, (1, 2, 3, 4), (5, 6), (7,))
    assert fit_length(pair, 6, truncate_prompt=False) is pair
    assert fit_length(pair, 5, truncate_prompt=False) is None
    assert fit_length(pair, 5, truncate_prompt=True) == Pair(0, (2, 3, 4), (5, 6), (7,))
    assert fit_length(pair, 2, truncate_prompt=True) is None  # the answer alone fills it: no prompt token left


def test_build_pairs_counts_what_it_dropped(tokenizer: Any) -> None:
    rows = [{"prompt": "Q: 1+1= A:", "chosen": " 2", "rejected": " b"},
            {"prompt": "Q: 1+1= A:", "chosen": " 2", "rejected": " 2"},  # no preference
            {"prompt": "Q: 1+1= A:", "chosen": " 2" * 40, "rejected": " b"}]  # too long
    pairs, counts = build_pairs(rows, tokenizer, **KEYS, max_length=24, truncate_prompt=False)
    assert [p.index for p in pairs] == [0] and counts.dropped == [1, 2] and counts.kept == 1


def test_packing_interleaves_chosen_and_rejected_with_shifted_answer_masks() -> None:
    pairs = [Pair(10, (1, 2), (3, 4, 5), (6,)), Pair(11, (7,), (8,), (9, 9))]
    batch = pack_pairs(pairs, pad_id=0)
    assert batch.indices == [10, 11] and batch.n_pairs == 2
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 2, 6, 0, 0], [7, 8, 0, 0, 0], [7, 9, 9, 0, 0]]
    assert batch.attention_mask.sum(1).tolist() == [5, 3, 2, 3]
    assert batch.last_index.tolist() == [4, 2, 1, 2]
    # position p predicts token p + 1: answer tokens at 2..4 are predicted at positions 1..3
    expected = [[False, True, True, True], [False, True, False, False], [True, False, False, False],
                [True, True, False, False]]
    assert batch.loss_mask.tolist() == expected
    assert batch.loss_mask.dtype == torch.bool


def test_split_pairs_keeps_pairs_whole_within_a_token_budget() -> None:
    pairs = [Pair(i, (1,) * 3, (2,) * n, (3,)) for i, n in enumerate((1, 1, 5, 1))]
    groups = split_pairs(pairs, max_tokens=2 * 4 * 2, min_count=1)  # two short pairs fit, the long one alone
    assert [[p.index for p in g] for g in groups] == [[0, 1], [2], [3]]
    assert [[p.index for p in g] for g in split_pairs(pairs, max_tokens=None, min_count=3)] == [[0, 1], [2], [3]]


def test_the_pair_type_is_torch_free() -> None:
    import subprocess
    import sys

    program = "import sys, rlkit.jobs.pairs.data; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_tokenizer_without_chat_template_or_eos_is_a_step_error_naming_the_row(tiny_model_dir: Path) -> None:
    """Not a traceback from transformers in the job: the row and what the tokenizer lacks (submit-time checks catch
    the missing template first: tests/unit/jobs/test_validate_pairs.py)."""
    from transformers import AutoTokenizer

    no_template = AutoTokenizer.from_pretrained(tiny_model_dir)
    no_template.chat_template = None
    chat = {"prompt": [{"role": "user", "content": "q"}], "chosen": "a", "rejected": "b"}
    with pytest.raises(StepError, match="row 3: the tokenizer cannot render this chat"):
        encode_pair(no_template, chat, 3, **KEYS)
    no_eos = AutoTokenizer.from_pretrained(tiny_model_dir)
    no_eos.eos_token = None
    assert no_eos.eos_token_id is None
    with pytest.raises(StepError, match="row 2: the tokenizer has no end-of-sequence token"):
        encode_pair(no_eos, {"prompt": "Q: 1+2= A:", "chosen": " 3", "rejected": " c"}, 2, **KEYS)
