"""Rows shaped exactly as verl's examples/data_preprocess/gsm8k.py writes them, in a Parquet file: `prompt` a list of
chat messages, the reference answer nested in `reward_model.ground_truth` (rlkit reads them with
reward.answer_key: reward_model.ground_truth, what `rlkit migrate` of a verl run writes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ANSWER = "reward_model.ground_truth"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'  # verl's gsm8k.py
GSM8K = [("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
          "clips did Natalia sell altogether in April and May?", "Natalia sold 48/2 = 24 clips in May.\n"
          "Natalia sold 48+24 = 72 clips altogether in April and May.\n#### 72"),
         ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did "
          "she earn?", "Weng earns 12/60 = $0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $10.\n#### 10"),
         ("A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it "
          "take?", "It takes 2/2=1 bolt of white fiber\nSo the total amount of fabric is 2+1=3 bolts\n#### 3")]


def verl_gsm8k_row(index: int, question: str, answer: str, split: str = "train") -> dict[str, Any]:
    """A row as verl's gsm8k.py `process_fn` makes it (its extract_solution: the number after '#### ')."""
    return {"data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer.split("#### ")[1].replace(",", "")},
            "extra_info": {"split": split, "index": index, "answer": answer, "question": question}}


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Rows written as `datasets`' to_parquet writes them (the same Arrow schema: structs and a list of structs)."""
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def verl_gsm8k_parquet(path: Path, split: str = "train") -> Path:
    """GSM8K rows in verl's form, as verl's gsm8k.py writes its train.parquet / test.parquet."""
    return write_parquet(path, [verl_gsm8k_row(i, q, a, split) for i, (q, a) in enumerate(GSM8K)])
