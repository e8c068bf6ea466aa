"""The CPU SFT demo's toy data: the digits task's prompts ("Q: a+b= A:") with their answers as targets.

The target format is a space, the sum's digits, then the end of the text (EOS, or the chat template's end of turn).
A tiny random-init model (rlkit.models.tiny) learns that format within a few dozen optimizer steps on a CPU, while
learning the sums themselves takes far longer: so an end-to-end test can check that SFT lowers the validation loss
and that greedy completions of held-out prompts are then digits only, ended by EOS (the digits task's reward is
1.0 for them). The prompts are the GRPO demo's (rlkit.tasks.digits) in the same raw-text form, so an sft stage can
warm up the model of a grpo stage. Training and validation prompts are disjoint pairs (a, b).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

MAX_OPERAND = 49  # as the GRPO demo's prompts: sums of at most two digits


def digit_pairs(count: int, valid_count: int, seed: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Two disjoint random samples of operand pairs (training, validation), fixed by `seed`."""
    pairs = [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    if count + valid_count > len(pairs):
        raise ValueError(f"at most {len(pairs)} distinct prompts exist; asked for {count} + {valid_count}")
    random.Random(seed).shuffle(pairs)
    return pairs[:count], pairs[count : count + valid_count]


def sft_row(a: int, b: int, *, messages: bool) -> dict[str, Any]:
    """One row: plaintext (prompt, response) or a chat (messages) with the same text."""
    prompt, response = f"Q: {a}+{b}= A:", f" {a + b}"
    if messages:
        return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]}
    return {"prompt": prompt, "response": response, "answer": str(a + b)}


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)
    return path


def write_sft_dataset(directory: Path, count: int = 512, valid_count: int = 64, seed: int = 0, *,
                      messages: bool = False) -> tuple[Path, Path]:
    """Write sft-train.jsonl and sft-valid.jsonl (or sft-chat-*.jsonl with `messages`) into `directory`; the same
    arguments always write the same files."""
    train, valid = digit_pairs(count, valid_count, seed)
    stem = "sft-chat" if messages else "sft"
    return (_write(directory / f"{stem}-train.jsonl", [sft_row(a, b, messages=messages) for a, b in train]),
            _write(directory / f"{stem}-valid.jsonl", [sft_row(a, b, messages=messages) for a, b in valid]))


def main(argv: list[str] | None = None) -> int:
    """`python -m rlkit.tasks.digits_sft DIR [--messages]`: write the training and validation files into DIR."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rlkit.tasks.digits_sft", description=main.__doc__)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--messages", action="store_true", help="chat rows (a messages column) instead of "
                                                                 "prompt/response columns")
    args = parser.parse_args(argv)
    for path in write_sft_dataset(args.directory, messages=args.messages):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
