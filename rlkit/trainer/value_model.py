"""Saving a trained value model (a reward model of job type rw, the PPO critic) as a reloadable Hugging Face
directory with its head note. The model itself (building, loading, per-token values, last-token scores) is
rlkit.models.value_model, below the rewards that score with it; saving writes weights through rlkit.weights.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from rlkit.config.model_config import VALUE_HEAD_NOTE as HEAD_NOTE

Kind = Literal["reward", "critic"]
_NOT_COPIED = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".index.json")
_READS = {"reward": "score of a whole sequence: the head's output at the sequence's last token",
          "critic": "value of each state: the head's output at every token"}


def save_value_model(state_dict: Mapping[str, Tensor], model_config: Any, source_dir: str | Path, out_dir: str | Path,
                     *, kind: Kind, dtype: torch.dtype | None = None, tokenizer_dir: str | Path = "") -> Path:
    """Write a reloadable value model directory `out_dir` (replaced if it exists): the weights of `state_dict`
    (e.g. the engine's full state dict on rank 0), `model_config` (the loaded model's `config`), the tokenizer and
    chat template of `source_dir` (the model trained from; `tokenizer_dir`'s tokenizer files instead when given: the
    config's tokenizer_path), and the head note."""
    from rlkit.weights.hf_export import WEIGHTS_NAME, write_weights

    source, out = Path(source_dir), Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    template = Path(tempfile.mkdtemp(prefix=f".{out.name}.template.", dir=out.parent))
    try:
        for item in source.iterdir():  # tokenizer and chat template; weights and index come from state_dict
            if item.is_file() and not item.name.startswith(".") and not item.name.endswith(_NOT_COPIED):
                shutil.copyfile(item, template / item.name)
        model_config.save_pretrained(template)
        note = {"kind": kind, "reads": _READS[kind], "head": "score", "num_labels": 1,
                "load": "rlkit.models.value_model.load_value_model", "weights": WEIGHTS_NAME}
        (template / HEAD_NOTE).write_text(json.dumps(note, indent=2, sort_keys=True) + "\n")
        return write_weights(state_dict, template, out, dtype, replace=True,
                             tokenizer_dir=Path(tokenizer_dir) if tokenizer_dir else None)
    finally:
        shutil.rmtree(template, ignore_errors=True)
