"""The digits SFT toy data: deterministic, held-out prompts, and the target format the end-to-end test checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.tasks.digits import digits_reward
from rlkit.tasks.digits_sft import digit_pairs, write_sft_dataset


def rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_same_arguments_write_the_same_files_and_another_seed_others(tmp_path: Path) -> None:
    first = [p.read_bytes() for p in write_sft_dataset(tmp_path / "a", count=64, valid_count=16, seed=3)]
    again = [p.read_bytes() for p in write_sft_dataset(tmp_path / "b", count=64, valid_count=16, seed=3)]
    other = [p.read_bytes() for p in write_sft_dataset(tmp_path / "c", count=64, valid_count=16, seed=4)]
    assert first == again and first != other


def test_validation_prompts_are_held_out_and_targets_are_digits(tmp_path: Path) -> None:
    train, valid = write_sft_dataset(tmp_path, count=512, valid_count=64)
    train_rows, valid_rows = rows(train), rows(valid)
    assert (len(train_rows), len(valid_rows)) == (512, 64)
    assert not {r["prompt"] for r in train_rows} & {r["prompt"] for r in valid_rows}
    for row in train_rows + valid_rows:
        a, b = (int(x) for x in str(row["prompt"]).removeprefix("Q: ").removesuffix("= A:").split("+"))
        assert row["response"] == f" {a + b}" and row["answer"] == str(a + b)
        assert digits_reward(str(row["prompt"]), str(row["response"]), row) == 1.0


def test_the_chat_variant_holds_the_same_text(tmp_path: Path) -> None:
    plain, _ = write_sft_dataset(tmp_path, count=8, valid_count=2)
    chat, _ = write_sft_dataset(tmp_path, count=8, valid_count=2, messages=True)
    assert chat.name == "sft-chat-train.jsonl"
    for p, c in zip(rows(plain), rows(chat), strict=True):
        assert c["messages"] == [{"role": "user", "content": p["prompt"]},
                                 {"role": "assistant", "content": p["response"]}]


def test_asking_for_more_prompts_than_exist_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 2500 distinct prompts"):
        digit_pairs(2500, 1, 0)


def test_the_command_line_writes_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlkit.tasks.digits_sft import main

    assert main([str(tmp_path), "--messages"]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "sft-chat-train.jsonl"),
                                               str(tmp_path / "sft-chat-valid.jsonl")]
    assert len(rows(tmp_path / "sft-chat-train.jsonl")) == 512
