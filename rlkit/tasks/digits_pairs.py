"""Preference pairs for the digits toy task (rlkit.tasks.digits), for the CPU demos of job types rw and dpo.

Each row is an addition prompt "Q: a+b= A:" with a chosen answer in digits (the sum) and a rejected one that is not
digits: half of the time the sum with every digit replaced by a letter (0 -> a, ..., 9 -> j: the same number of
characters, so length is no cue), otherwise a word from a fixed list. A reward model learns to score digit answers
higher, and DPO to prefer them, within a minute on a CPU: the tiny model only has to tell digit tokens from others.

The training rows use a in 0..49 and the held-out rows a in 50..99, so no held-out prompt was trained on. What a
test may ask of a trained reward model, measured on the tiny model (`rlkit.models.tiny`, 64 held-out pairs): an
untrained one orders held-out pairs right by chance only on average: its fresh head is random, and as a head and
its negation order every pair oppositely, the accuracy over head seeds centres on 0.5 (0.47 over seeds 0..39), but
the pairs are alike, so one head's accuracy spreads far (0.05..0.78 over those seeds; 0.75 for the default seed 0).
After 5 training steps of 16 pairs (lr 1e-3) the held-out accuracy is 1.0. A threshold of 0.9 is thus above every
untrained head seen and reached with room; a test should also check the gain over the same model untrained.
DPO on the same pairs (beta 0.1, 30 steps) moves the held-out reward margin from 0 to about 3.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("yes", "no", "maybe", "the answer", "many", "I do not know", "a lot", "seven", "twelve", "ok")
_LETTERS = "abcdefghij"


def _rejected(answer: str, rng: random.Random) -> str:
    if rng.random() < 0.5:
        return "".join(_LETTERS[int(d)] for d in answer)
    return rng.choice(WORDS)


def pair_rows(count: int, *, seed: int, held_out: bool = False) -> list[dict[str, str]]:
    """`count` rows {prompt, chosen, rejected}; the same rows for the same arguments."""
    rng = random.Random(seed)
    low = 50 if held_out else 0
    rows = []
    for _ in range(count):
        a, b = rng.randint(low, low + 49), rng.randint(0, 49)
        answer = str(a + b)
        rows.append({"prompt": f"Q: {a}+{b}= A:", "chosen": f" {answer}", "rejected": f" {_rejected(answer, rng)}"})
    return rows


def write_pairs(path: Path, count: int = 256, seed: int = 0, *, held_out: bool = False) -> Path:
    """Write `pair_rows` as jsonl (atomically: a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        for row in pair_rows(count, seed=seed, held_out=held_out):
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)
    return path


def write_pair_splits(directory: Path, *, train: int = 256, held_out: int = 64, seed: int = 0) -> tuple[Path, Path]:
    """digits_pairs.jsonl (training) and digits_pairs_heldout.jsonl (disjoint prompts) in `directory`."""
    return (write_pairs(directory / "digits_pairs.jsonl", train, seed),
            write_pairs(directory / "digits_pairs_heldout.jsonl", held_out, seed + 1, held_out=True))
