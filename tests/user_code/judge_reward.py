"""A reward function as a user writes it, outside the rlkit package (its directory on PYTHONPATH at submit, which
the job inherits): the digits reward, given only when the trial's auxiliary model `judge` answered a question about
the completion. Every answer is recorded in <trial>/judge-calls.jsonl, which tests/integration/test_auxiliary_e2e.py
counts against the judge server's own log."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlkit.rewards.auxiliary import TRIAL_DIR_ENV, auxiliary_model
from rlkit.tasks.digits import digits_reward

JUDGE = auxiliary_model("judge")  # nothing is contacted yet: this module is also imported at submit


def digits_with_judge(prompt: str, completion: str, row: dict[str, Any]) -> float:
    answers = JUDGE.generate(f"Q: is '{completion}' made of digits? A:", max_new_tokens=4, temperature=0.0)
    if len(answers) != 1 or not isinstance(answers[0], str):
        raise RuntimeError(f"the judge gave {answers!r}")
    with open(Path(os.environ[TRIAL_DIR_ENV]) / "judge-calls.jsonl", "a") as calls:
        calls.write(json.dumps({"completion": completion, "judge": answers[0], "pid": os.getpid()}) + "\n")
    return digits_reward(prompt, completion, row)


digits_with_judge.warmup = JUDGE.warmup  # type: ignore[attr-defined]  # the tokenizer and a server, before calls
