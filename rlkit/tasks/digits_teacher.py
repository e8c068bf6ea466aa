"""A teacher that knows the digits task, for the distillation demo and its test: the tiny model
(rlkit.models.tiny) fine-tuned in-process on the SFT rows of rlkit.tasks.digits_sft (" <sum>" then EOS), so that its
samples are digits only while the untrained student's are not: sampled at temperature 1, digits_reward 0.99 after the
default 80 steps (0.98 after 40, 0.93 after 20), 0.014 for the student. 80, because a student of the 40-step teacher
stalls lower (tests/integration/test_distill_e2e.py).

A student distilled from it learns the task without any reward function. Built in a few seconds on one CPU core
(0.36 M parameters); the same tokenizer as the student (it is the same model's), which job type distill requires.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

MARKER = ".rlkit-digits-teacher.json"


def build_digits_teacher(out_dir: str | Path, student_dir: str | Path, *, steps: int = 80, lr: float = 3e-3,
                         batch: int = 32, seed: int = 0) -> Path:
    """Fine-tune the model at `student_dir` on the digits task into `out_dir` (reused when already built alike)."""
    import torch

    out = Path(out_dir).resolve()
    params = {"student": str(Path(student_dir).resolve()), "steps": steps, "lr": lr, "batch": batch, "seed": seed}
    marker = out / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == params:
        return out
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # why: a 0.36 M model's matmuls gain nothing from threads; 2 cost ~8x the CPU, 4x the wall
    try:
        _train_and_save(out, Path(student_dir), params)
    finally:
        torch.set_num_threads(threads)
    return out


def _train_and_save(out: Path, student_dir: Path, params: dict[str, Any]) -> None:
    """The fine-tuning itself, then an all-or-nothing write of the model, its tokenizer and the marker."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.tasks.digits_sft import digit_pairs, sft_row

    steps, lr, batch, seed = params["steps"], params["lr"], params["batch"], params["seed"]
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    model = AutoModelForCausalLM.from_pretrained(student_dir, dtype=torch.float32)
    model.train()
    pairs, _ = digit_pairs(1024, 0, seed)
    rows = [sft_row(a, b, messages=False) for a, b in pairs]
    eos = tokenizer.eos_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for step in range(steps):
        chunk = [rows[(step * batch + i) % len(rows)] for i in range(batch)]
        ids, labels = [], []
        for row in chunk:
            prompt = tokenizer.encode(row["prompt"], add_special_tokens=False)
            target = [*tokenizer.encode(row["response"], add_special_tokens=False), eos]
            ids.append(prompt + target)
            labels.append([-100] * len(prompt) + target)
        width = max(len(x) for x in ids)
        input_ids = torch.tensor([x + [eos] * (width - len(x)) for x in ids])
        label_ids = torch.tensor([y + [-100] * (width - len(y)) for y in labels])
        attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
        loss = model(input_ids=input_ids, attention_mask=attention, labels=label_ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".teacher-build-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        out.mkdir(parents=True, exist_ok=True)
        (out / MARKER).unlink(missing_ok=True)
        for item in sorted(tmp.iterdir()):
            item.chmod(0o644)
            os.replace(item, out / item.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (out / MARKER).write_text(json.dumps(params, sort_keys=True) + "\n")
