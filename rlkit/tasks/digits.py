"""The CPU demo's toy task: answer an addition prompt with digits only (a format reward a tiny model can learn).

The tiny model (`rlkit.models.tiny`) starts from random weights, so it cannot add; what GRPO can teach it within a
few dozen steps on two CPU cores is the answer's format. The reward is the fraction of non-space characters of
the completion that are digits: about 0.01 for the random policy (10 of 512 tokens are digits) and 1.0 for a
policy that answers only with digits. Real experiments use the `math` reward on real data (configs/grpo.yaml).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any


def digits_reward(prompt: str, completion: str, row: dict[str, Any]) -> float:
    """Fraction of the completion's non-space characters that are decimal digits (0.0 for an empty answer)."""
    chars = [c for c in completion if not c.isspace()]
    if not chars:
        return 0.0
    return sum(c in "0123456789" for c in chars) / len(chars)


def brevity_reward(prompt: str, completion: str, row: dict[str, Any]) -> float:
    """1.0 for an answer of at most 3 non-space characters, falling linearly to 0.0 at 8 (a sum of two digits needs
    at most 3): the second function of configs/grpo-mix-cpu-demo.yaml's weighted reward mix."""
    n = sum(not c.isspace() for c in completion)
    return max(0.0, min(1.0, (8 - n) / 5))


def write_dataset(path: Path, count: int = 256, seed: int = 0) -> Path:
    """`count` prompts "Q: a+b= A:" with their answers, as jsonl (prompt, answer)."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        for _ in range(count):
            a, b = rng.randint(0, 49), rng.randint(0, 49)
            f.write(json.dumps({"prompt": f"Q: {a}+{b}= A:", "answer": str(a + b)}) + "\n")
    tmp.replace(path)
    return path
