"""Copies of a Hugging Face checkpoint directory with its tensors (and config) edited: a renamed key, another dtype,
a smaller vocabulary, split over several safetensors files with a model.safetensors.index.json."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

Tensors = dict[str, torch.Tensor]


def checkpoint_variant(src: Path, out: Path, edit: Callable[[Tensors], Tensors] = lambda t: t, *,
                       config: dict[str, Any] | None = None, files: int = 1) -> Path:
    """`src` copied to `out` (tokenizer and all) with its tensors `edit`ed, `config` merged into config.json, and
    the tensors in `files` safetensors files (more than one: model-0000k-of-0000n.safetensors and an index)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out, ignore=shutil.ignore_patterns("model*.safetensors*"))
    tensors = edit(load_file(str(src / "model.safetensors")))
    if config:
        path = out / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}, indent=1))
    if files == 1:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return out
    keys = sorted(tensors)
    weight_map = {}
    for part in range(files):
        name = f"model-{part + 1:05d}-of-{files:05d}.safetensors"
        chunk = keys[part::files]
        save_file({key: tensors[key].contiguous() for key in chunk}, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk, name))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out
