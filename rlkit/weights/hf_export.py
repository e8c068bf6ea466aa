"""Weight versions as Hugging Face model directories on a shared filesystem: the trainer writes version-<N>/ (all
shards, config and tokenizer files, an index), renamed in only when complete, so a server never sees a partial
version. torch and safetensors are imported inside the functions that need them (trainer side only).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.fsutil import write_dir
from rlkit.models.tiny import MARKER as TINY_MARKER

if TYPE_CHECKING:
    import torch

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
MAX_SHARD_BYTES = 2 * 1024**3
# Files of the source model directory that are not copied: its weights (replaced) and rlkit's tiny-build marker,
# which describes the weights of an untouched build.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")
_SKIP_FILES = frozenset({WEIGHTS_INDEX_NAME, "pytorch_model.bin.index.json", TINY_MARKER})
# What a tokenizer directory holds (transformers' files for fast and slow tokenizers, chat templates).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "chat_template.jinja",
                   "chat_template.json")
_VERSION_DIR = re.compile(r"^version-(\d+)$")
_VERSION_TMP = re.compile(r"^\.version-(\d+)\..*\.tmp$")


def version_dir(weights_root: Path, version: int) -> Path:
    """The directory of weight version `version` under `weights_root`: `weights_root/version-<N>`."""
    if version < 0:
        raise ValueError(f"weight versions are >= 0, got {version}")
    return Path(weights_root) / f"version-{version}"


def tied_weight_aliases(model_dir: Path) -> dict[str, str]:
    """`{alias: canonical}` state-dict keys that the model in `model_dir` ties (empty if it does not tie).

    Read from the config (`tie_word_embeddings`, of its text config for composite models) and the transformers class
    named in `architectures` (`_tied_weights_keys`, e.g. `{"lm_head.weight": "model.embed_tokens.weight"}`); when
    transformers does not know the model, `lm_head.weight` is taken as tied to `model.embed_tokens.weight`.
    """
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(model_dir)
        ties = bool(getattr(config.get_text_config(), "tie_word_embeddings", False))
        architectures = list(getattr(config, "architectures", None) or ())
    except (ValueError, KeyError, OSError):  # a model type this transformers does not know: read the file
        raw = json.loads((Path(model_dir) / "config.json").read_text())
        text = raw.get("text_config") or {}
        ties = bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
        architectures = list(raw.get("architectures") or ())
    if not ties:
        return {}
    for arch in architectures:
        keys = getattr(getattr(transformers, arch, None), "_tied_weights_keys", None)
        if isinstance(keys, Mapping) and keys:
            return {str(k): str(v) for k, v in keys.items()}
    return {"lm_head.weight": "model.embed_tokens.weight"}


def resolve_ties(tensors: dict[str, torch.Tensor], aliases: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """Drop tied alias keys (as `save_pretrained` does), after checking that they still equal their canonical key."""
    import torch

    out = dict(tensors)
    for alias, canonical in aliases.items():
        if alias not in out:
            continue
        if canonical not in out:  # only the alias was given: store it under the canonical name
            out[canonical] = out.pop(alias)
            continue
        a, c = out[alias], out[canonical]
        same = a.shape == c.shape and (a is c or torch.equal(a, c.to(a.dtype)))
        if not same:
            raise ValueError(
                f"the config ties {alias} to {canonical} but the state dict holds different values for them: "
                "the training broke the tie. Untie in the config (tie_word_embeddings=false) or keep them tied"
            )
        del out[alias]
    return out


def _prepare(state_dict: Mapping[str, Any], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """CPU, contiguous, floating tensors cast to `dtype`; keys that are views of one tensor stay one tensor."""
    import torch

    prepared: dict[str, torch.Tensor] = {}
    done: dict[tuple[Any, ...], torch.Tensor] = {}
    for name, value in state_dict.items():
        tensor = value.full_tensor() if hasattr(value, "full_tensor") else value  # a DTensor
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state dict entry {name!r} is a {type(value).__name__}, not a tensor")
        tensor = tensor.detach()
        view = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                tuple(tensor.stride()), tensor.dtype)
        if view not in done:
            out = tensor.to("cpu")
            if dtype is not None and out.is_floating_point():
                out = out.to(dtype)
            done[view] = out.contiguous()
        prepared[name] = done[view]
    return prepared


def _own_storage(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy for every tensor whose storage another one uses too: safetensors refuses shared storage."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        ptr = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if ptr in seen else tensor
        seen.add(out[name].untyped_storage().data_ptr())
    return out


def _shards(tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        if shards[-1] and size + tensor.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += tensor.nbytes
    return shards


def write_weights(
    state_dict: Mapping[str, torch.Tensor],
    model_dir: Path,
    out_dir: Path,
    dtype: torch.dtype | None,
    *,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    replace: bool = False,
    tokenizer_dir: Path | None = None,
    also_write: Callable[[Path], object] | None = None,
) -> Path:
    """Write `state_dict` as a complete HF model directory `out_dir` and return it.

    - weights: `model.safetensors`, or `model-0000i-of-0000n.safetensors` shards plus `model.safetensors.index.json`
      when they exceed `max_shard_bytes`; floating tensors cast to `dtype` (None: as given)
    - every other top-level file of `model_dir` (config.json, generation_config.json, tokenizer and chat template
      files, custom code) is copied; config.json's `dtype` is set to `dtype` when one is given; the tokenizer files
      of `tokenizer_dir` (the config's tokenizer_path) replace model_dir's, so the directory is a model on its own
    - tied models: a transformers state dict holds both `model.embed_tokens.weight` and `lm_head.weight` (the same
      tensor). Only the canonical key is written, as `save_pretrained` does; transformers and vLLM tie on load.
      Different values under a tied pair raise `ValueError`.
    - `also_write(directory)`: more files of the same checkpoint (a LoRA run's `adapter/`), written into the
      temporary directory, with their own permissions, before the rename

    Written into a temporary directory beside `out_dir`, every file fsynced, then renamed to `out_dir` in one step: a
    server never sees a partial version. `out_dir` must not exist yet (`FileExistsError`): a version is immutable.
    With `replace` (saver checkpoints, written again after a resume) an existing `out_dir` is replaced by
    rename-aside, rename-in, delete (`rlkit.fsutil.replace_dir`).
    """
    from safetensors.torch import save_file

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json: give the directory of the model being trained")
    tensors = _own_storage(resolve_ties(_prepare(state_dict, dtype), tied_weight_aliases(model_dir)))

    def fill(tmp: Path) -> None:
        for item in sorted(model_dir.iterdir()):
            if not item.is_file() or item.name.startswith(".") or item.name in _SKIP_FILES:
                continue
            if item.name.endswith(_WEIGHT_SUFFIXES):
                continue
            shutil.copyfile(item, tmp / item.name)
        for name in TOKENIZER_FILES if tokenizer_dir is not None else ():
            source = Path(tokenizer_dir or "") / name
            if source.is_file():
                shutil.copyfile(source, tmp / name)
        if dtype is not None:
            config_path = tmp / "config.json"
            config = json.loads(config_path.read_text())
            dtype_name = str(dtype).removeprefix("torch.")
            config["dtype"] = dtype_name
            if "torch_dtype" in config:
                config["torch_dtype"] = dtype_name
            config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        shards = _shards(tensors, max_shard_bytes)
        if len(shards) == 1:
            save_file(shards[0], str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        else:
            weight_map: dict[str, str] = {}
            for i, shard in enumerate(shards, start=1):
                name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / name), metadata={"format": "pt"})
                weight_map.update(dict.fromkeys(shard, name))
            index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
            (tmp / WEIGHTS_INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

    # `also_write`'s files land with the weights, in the same rename
    return write_dir(out_dir, fill, replace=replace, then=also_write)


def remove_old_versions(weights_root: Path, keep: set[int]) -> list[Path]:
    """Delete the `version-<N>` directories under `weights_root` whose N is not in `keep`; return what was removed.

    Also removes temporary directories left by interrupted writes of versions older than every kept one (never those
    of newer versions: they may be being written now).
    """
    root = Path(weights_root)
    if not root.is_dir():
        return []
    newest_kept = max(keep, default=-1)
    removed: list[Path] = []
    for entry in sorted(root.iterdir()):
        if not entry.is_dir() or entry.is_symlink():
            continue
        done, tmp = _VERSION_DIR.match(entry.name), _VERSION_TMP.match(entry.name)
        if (done and int(done.group(1)) not in keep) or (tmp and int(tmp.group(1)) < newest_kept):
            shutil.rmtree(entry)
            removed.append(entry)
    return removed
