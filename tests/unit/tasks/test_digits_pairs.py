"""The digits preference pairs: deterministic, chosen = digits, rejected = none, held-out prompts never trained on."""

from __future__ import annotations

import json
from pathlib import Path

from rlkit.tasks.digits import digits_reward
from rlkit.tasks.digits_pairs import pair_rows, write_pair_splits


def test_rows_are_deterministic_and_prefer_digits() -> None:
    rows = pair_rows(200, seed=3)
    assert rows == pair_rows(200, seed=3) and rows != pair_rows(200, seed=4)
    for row in rows:
        a, b = (int(x) for x in row["prompt"].removeprefix("Q: ").removesuffix("= A:").split("+"))
        assert row["chosen"] == f" {a + b}"
        assert digits_reward(row["prompt"], row["chosen"], row) == 1.0
        assert digits_reward(row["prompt"], row["rejected"], row) == 0.0
    letter_coded = [r for r in rows if len(r["rejected"]) == len(r["chosen"]) and r["rejected"][1:].isalpha()]
    assert len(letter_coded) > 50  # about half: those differ from chosen in their characters only, not length


def test_held_out_prompts_are_disjoint_from_training(tmp_path: Path) -> None:
    train, held = write_pair_splits(tmp_path, train=256, held_out=64)
    train_prompts = {json.loads(line)["prompt"] for line in train.read_text().splitlines()}
    held_prompts = [json.loads(line)["prompt"] for line in held.read_text().splitlines()]
    assert len(train_prompts) > 200 and len(held_prompts) == 64
    assert not train_prompts & set(held_prompts)
