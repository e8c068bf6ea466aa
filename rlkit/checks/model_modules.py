"""The weight-holding modules of a local model directory, read torch-free from its safetensors headers (the login
node checks `actor.target_modules` against them, so an adapter on a module the model lacks is refused at submit
instead of by peft minutes into the job).

A safetensors file starts with an 8-byte little-endian header length and a JSON header naming every tensor; a
sharded model lists its tensors in model.safetensors.index.json. Only headers are read, never weights. A directory
without safetensors (a hub id, .bin weights, a stand-in) gives None: nothing to check against.
"""

from __future__ import annotations

import struct
from pathlib import Path

from rlkit import untrusted_json
from rlkit.config.model_config import is_local_path
from rlkit.config.problems import Problems

_HEADER_LIMIT = 100 * 2**20  # a header larger than this is not a model's (treat the file as hostile)
_INDEX = "model.safetensors.index.json"


def _header_names(path: Path) -> list[str]:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("shorter than a safetensors header")
        (size,) = struct.unpack("<Q", raw)
        if size > _HEADER_LIMIT:
            raise ValueError(f"a safetensors header of {size} bytes")
        header = untrusted_json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError("a safetensors header that is not a JSON object")
    return [str(name) for name in header if name != "__metadata__"]


def tensor_names(model_dir: str) -> list[str] | None:
    """Every tensor name of the model's safetensors weights; None when there are none to read."""
    if not is_local_path(model_dir):
        return None
    root = Path(model_dir)
    try:
        index = root / _INDEX
        if index.is_file():
            weight_map = untrusted_json.loads(index.read_text()).get("weight_map")
            return [str(name) for name in weight_map] if isinstance(weight_map, dict) else None
        files = sorted(f for f in root.glob("*.safetensors") if f.is_file())  # regular files: a FIFO would block
        if not files:
            return None
        return [name for file in files for name in _header_names(file)]
    except (OSError, ValueError, UnicodeDecodeError, struct.error):
        return None  # unreadable weights are reported by the loader's own checks, not guessed at here


def module_paths(names: list[str]) -> set[str]:
    """The dotted paths of the modules that own a `.weight` (`model.layers.0.self_attn.q_proj`)."""
    return {name.rsplit(".", 1)[0] for name in names if name.endswith(".weight") and "." in name}


def matches(target: str, paths: set[str]) -> bool:
    """peft's rule for a target name in a list: a module whose path is the name or ends with `.name`."""
    return any(path == target or path.endswith("." + target) for path in paths)


def check_modules_in_model(model_dir: str, targets: list[str], problems: Problems) -> None:
    """A problem naming every entry of `targets` (actor.target_modules) that no module of the model matches."""
    names = tensor_names(model_dir) if targets != ["all-linear"] else None  # peft's shorthand fits every model
    if not names:
        return
    paths = module_paths(names)
    missing = [t for t in targets if not matches(t, paths)]
    if missing:
        known = sorted({path.rsplit(".", 1)[-1] for path in paths if not path.rsplit(".", 1)[-1].isdigit()})
        problems.add(f"actor.target_modules: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not a "
                     f"module of the model at {model_dir}",
                     hint=f"choose among its modules: {', '.join(known)} (or [all-linear])")
