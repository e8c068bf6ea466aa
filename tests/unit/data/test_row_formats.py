"""GSM8K's rows as AReaL reads them (rlkit.data.row_formats): one decision for the checks and the steps, the prompt asks
for a boxed answer, sft trains question -> answer, and the reference answer is what follows `####`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.config.schema.sft import SFTConfig
from rlkit.data.row_formats import BOX_INSTRUCTION, final_answer, is_gsm8k_row, rl_prompt, sft_columns
from rlkit.rewards.builtin import math_reward, reference_answers

ROW = {"question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
       "answer": "In May she sold 48/2 = 24 clips.\nIn all she sold 48+24 = 72 clips.\n#### 72"}


def test_which_rows_are_gsm8k() -> None:
    assert is_gsm8k_row(ROW, "prompt")
    assert not is_gsm8k_row(ROW, "question"), "an explicit column wins"
    assert not is_gsm8k_row({**ROW, "prompt": "p"}, "prompt"), "a prompt column wins"
    assert not is_gsm8k_row({"question": "q"}, "prompt") and not is_gsm8k_row({"question": 1, "answer": "a"}, "prompt")


def test_the_rl_prompt_asks_for_a_boxed_answer_and_other_rows_are_read_as_before() -> None:
    assert rl_prompt(ROW, "prompt") == [{"role": "user", "content": ROW["question"] + BOX_INSTRUCTION}]
    assert rl_prompt({"prompt": "1+1="}, "prompt") == "1+1="
    assert rl_prompt(ROW, "question") == ROW["question"]
    with pytest.raises(KeyError):
        rl_prompt({"text": "x"}, "prompt")


@pytest.mark.parametrize(("gold", "final"), [
    (ROW["answer"], "72"), ("So 1,000 + 234 = 1,234\n#### 1,234", "1234"), (" 7 ", "7"), ("a #### b #### -3", "-3"),
])
def test_the_reference_answer_is_what_follows_the_mark(gold: str, final: str) -> None:
    assert final_answer(gold) == final
    assert reference_answers({"answer": gold}, "answer") == [final]


def test_the_math_reward_scores_gsm8k_rows_on_the_final_answer() -> None:
    assert math_reward("p", "48/2 = 24, so \\boxed{72}", ROW) == 1.0
    assert math_reward("p", "\\boxed{24}", ROW) == 0.0


def test_sft_reads_question_and_answer(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from rlkit.jobs.sft.data import load_sft_dataset

    assert sft_columns(ROW, "prompt", "response") == ("question", "answer")
    assert sft_columns(ROW, "prompt", "solution") == ("prompt", "solution"), "an explicit column wins"
    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps(ROW) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    (example,) = load_sft_dataset(str(data), tokenizer, SFTConfig(apply_chat_template=False), max_length=None).examples
    trained = [t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if m]
    assert tokenizer.decode(trained[:-1]) == ROW["answer"] and trained[-1] == tokenizer.eos_token_id


HH = {"chosen": "\n\nHuman: Hi there\n\nAssistant: Hello! How can I help?\n\nHuman: A joke?\n\nAssistant: Why did...",
      "rejected": "\n\nHuman: Hi there\n\nAssistant: Hello! How can I help?\n\nHuman: A joke?\n\nAssistant: No."}


def test_hh_rlhf_pairs_split_at_the_last_shared_assistant_turn(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from rlkit.config.schema.experiment import DatasetConfig
    from rlkit.config.schema.pairs import RWConfig
    from rlkit.data.row_formats import pair_row
    from rlkit.jobs.pairs.data import pairs_from_config

    row = pair_row(HH, "prompt", "chosen", "rejected")
    assert row["prompt"].endswith("A joke?\n\nAssistant:") and row["prompt"].startswith("\n\nHuman: Hi there")
    assert (row["chosen"], row["rejected"]) == (" Why did...", " No.")
    assert pair_row(HH, "context", "chosen", "rejected") is HH, "an explicit prompt column wins"
    assert pair_row({"chosen": "a", "rejected": "b"}, "prompt", "chosen", "rejected") == {"chosen": "a",
                                                                                          "rejected": "b"}
    data = tmp_path / "hh.jsonl"
    data.write_text(json.dumps(HH) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    (pair,), _ = pairs_from_config(DatasetConfig(path=str(data)), RWConfig(), tokenizer)
    assert tokenizer.decode(pair.prompt_ids) == row["prompt"]
    assert tokenizer.decode(pair.chosen_ids).startswith(" Why did")
