"""Each rank reads its own rows of the checkpoint: the sharded build of a model whose weights are exactly the
checkpoint's safetensors (the plain causal LM, the frozen reference) without rank 0 building the whole model on its
host (rlkit.trainer.sharded_load's other path: a 70B model is 280 GB of float32 there).

`slice_plan` says, on rank 0, whether that is exactly what from_pretrained(dtype=float32) would give: every entry of
the model's state dict is one checkpoint tensor of the same shape (tied weights: one parameter, one tensor) or,
absent there, one the build drew itself (LoRA's adapter, a value model's fresh head: rlkit.trainer.fresh_params), no
checkpoint tensor is left over (but another head's, for a model with a head of its own), transformers renames or
converts no key (its weight conversions, the base-model prefix), every dtype casts to float32 exactly. Anything else
returns the reason, and the caller falls back. `load_slices` then fills every rank's local shards: the rows a
DTensor's placements give this rank, cast to float32 as from_pretrained casts (Tensor.to), copied in place.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
EXACT = {"F32", "BF16", "F16"}  # safetensors dtypes whose cast to float32 loses nothing
SHOWN = 3  # names quoted in a reason


@dataclass(frozen=True)
class Slice:
    """The checkpoint tensor (`key` in `file`) of one state-dict entry (`name`: the first of its tied names)."""

    name: str
    file: str
    key: str


@dataclass(frozen=True)
class _Stored:
    file: str
    dtype: str
    shape: tuple[int, ...]


def slice_plan(skeleton: nn.Module, path: str, fresh: Collection[str] = ()) -> list[Slice] | str:
    """The checkpoint tensor of every state-dict entry of `skeleton` (unsharded, on the meta device, as built from
    the config at `path`; peft's wrapper too, its names mapped by rlkit.trainer.fresh_params.checkpoint_names) but
    the `fresh` ones the checkpoint lacks (drawn by the build itself), or why reading it rank by rank would not be
    exactly from_pretrained's model."""
    from rlkit.trainer.fresh_params import checkpoint_names

    try:
        stored = _stored_tensors(Path(path))
    except Exception as exc:  # a missing, unreadable or malformed file: from_pretrained says what it makes of it
        return f"cannot read the checkpoint's safetensors ({type(exc).__name__}: {exc})"
    if isinstance(stored, str):
        return stored
    base, mapped = checkpoint_names(skeleton)
    config = getattr(base, "config", None)
    if getattr(config, "quantization_config", None) is not None:
        return "the checkpoint is quantized"
    renamed = _renamed_keys(base, list(stored), dict.fromkeys(mapped.values(), True))
    if renamed:
        return f"transformers renames or converts checkpoint keys: {renamed}"
    plan, problems, used = [], [], set()
    for names, tensor in _entries(skeleton):
        present = [mapped[name] for name in names if mapped[name] in stored]
        if not present and all(name in fresh for name in names):
            continue
        used.update(present)
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32:
            problems.append(f"{names[0]} is no float32 tensor")
        elif len(present) != 1:
            problems.append(f"{' / '.join(names)}: {len(present)} checkpoint tensors")
        elif stored[present[0]].shape != tuple(tensor.shape):
            problems.append(f"{present[0]} has shape {list(stored[present[0]].shape)}, the model {list(tensor.shape)}")
        elif stored[present[0]].dtype not in EXACT:
            problems.append(f"{present[0]} is {stored[present[0]].dtype}")
        else:
            plan.append(Slice(names[0], stored[present[0]].file, present[0]))
    left = sorted(set(stored) - used - _other_heads(base, stored, Path(path)))
    if left:
        problems.append(f"the model has no {', '.join(left[:SHOWN])}" + (f" (+{len(left) - SHOWN})"
                                                                        if len(left) > SHOWN else ""))
    if problems:
        return "; ".join(problems[:SHOWN]) + (f" (+{len(problems) - SHOWN} more)" if len(problems) > SHOWN else "")
    return plan


def _other_heads(model: nn.Module, stored: dict[str, _Stored], directory: Path) -> set[str]:
    """The checkpoint keys from_pretrained drops for a model that puts another head on the checkpoint's backbone (a
    value model on a causal LM: its lm_head), those outside the backbone's prefix when config.json names another
    architecture than the model's; none otherwise (a key the model does not take then says its names are off)."""
    prefix = getattr(model, "base_model_prefix", "")
    try:
        architectures = json.loads((directory / "config.json").read_text()).get("architectures")
    except Exception:  # an unreadable config: from_pretrained says what it makes of it, the plan takes no risk
        return set()
    if not prefix or not isinstance(architectures, list) or type(model).__name__ in architectures:
        return set()
    return {key for key in stored if not key.startswith(f"{prefix}.")}


def load_slices(model: nn.Module, plan: list[Slice]) -> None:
    """This rank's part of every planned tensor of `model` (FSDP2-sharded, allocated) read from the checkpoint, a
    tensor at a time; local (no collective). Each read maps the file anew and unmaps it after the copy: the mapped
    pages of a file held open would count in the rank's memory until the last of its tensors."""
    from safetensors import safe_open

    with torch.no_grad():
        for entry in plan:
            local, rows = local_part(tensor_of(model, entry.name))
            if local.numel() > 0:
                with safe_open(entry.file, framework="pt", device="cpu") as handle:
                    local.copy_(handle.get_slice(entry.key)[rows].to(local.dtype))


def local_part(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """(the tensor this rank holds, which part of the global tensor it is): a DTensor's local shard and the ranges
    its placements give this rank (FSDP2: torch.chunk's rows of dim 0); any other tensor whole."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(tensor, DTensor):
        return tensor, tuple(slice(0, size) for size in tensor.shape)
    local = tensor.to_local()
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    if tuple(local.shape) != tuple(shape):
        raise RuntimeError(f"a local shard of shape {list(local.shape)} where its placements give {list(shape)}")
    return local, tuple(slice(start, start + size) for start, size in zip(offset, shape, strict=True))


def _stored_tensors(directory: Path) -> dict[str, _Stored] | str:
    """Every tensor of the checkpoint from_pretrained reads (model.safetensors, else the files of the index)."""
    from safetensors import safe_open

    if not directory.is_dir():
        return f"{directory} is no local directory"
    if (directory / SINGLE).is_file():
        files = [directory / SINGLE]
    elif (directory / INDEX).is_file():
        weight_map = json.loads((directory / INDEX).read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            return f"{INDEX} has no weight_map of file names"
        names = sorted(set(weight_map.values()))
        outside = [name for name in names if Path(name).name != name or name in {".", ".."}]
        if outside:
            return f"{INDEX} names files outside the checkpoint's directory: {outside[:SHOWN]}"
        files = [directory / name for name in names]
    else:
        return f"no {SINGLE} or {INDEX}"
    stored: dict[str, _Stored] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for key in handle.keys():  # noqa: SIM118  (safe_open has keys(), no __iter__)
                if key in stored:
                    return f"{key} is in both {Path(stored[key].file).name} and {file.name}"
                part = handle.get_slice(key)
                stored[key] = _Stored(str(file), part.get_dtype(), tuple(part.get_shape()))
    return stored


def _entries(skeleton: nn.Module) -> Iterator[tuple[list[str], Any]]:
    """(names, tensor) of every distinct tensor of the state dict: tied names together (one parameter)."""
    groups: dict[int, tuple[list[str], Any]] = {}
    for name, tensor in skeleton.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), ([], tensor))[0].append(name)
    yield from groups.values()


def _renamed_keys(skeleton: nn.Module, keys: list[str], names: dict[str, bool]) -> list[str]:
    """The checkpoint keys that from_pretrained would rename or convert for this model (none: the names are the
    model's own, `names`), quoted as `key -> name`; every key when this transformers cannot say."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:
        return ["this transformers has no conversion mapping to check the keys against"]
    transforms = get_model_conversion_mapping(skeleton)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    prefix = getattr(skeleton, "base_model_prefix", None)
    renamed = []
    for key in keys:
        target, converter = rename_source_key(key, renamings, converters, prefix, names)
        if target not in names and key in names:  # from_pretrained's second try: the prefix alone
            target, converter = rename_source_key(key, [], [], base_model_prefix=prefix, meta_state_dict=names)
        if target != key or converter is not None:
            renamed.append(f"{key} -> {target}")
    return renamed[:SHOWN] + ([f"+{len(renamed) - SHOWN}"] if len(renamed) > SHOWN else [])


def tensor_of(model: nn.Module, name: str) -> torch.Tensor:
    module, _, leaf = name.rpartition(".")
    tensor = getattr(model.get_submodule(module), leaf)
    if not isinstance(tensor, torch.Tensor):
        raise RuntimeError(f"{name} is no tensor of the model")
    return tensor
