"""Trinity-RFT's LoRA settings as rlkit's, for `rlkit migrate` (rlkit.config.trinity): `model.lora_configs`, a list
of at most one adapter (its `lora_rank` 32, `lora_alpha` 32 and `target_modules` all-linear by default), becomes
actor.use_lora with the adapter's rank, alpha and modules. Left out, the file would migrate into a full fine-tune:
another run (all weights trained, far more memory) under the same name. What rlkit cannot take is refused naming
why: more than one adapter, an adapter to start from (`path`), Tinker (`model.tinker.enable`: a remote training
service, where rlkit trains on the job's own GPUs).
"""

from __future__ import annotations

from typing import Any

from rlkit.config.problems import Problems
from rlkit.config.trinity_terms import Left, Moved, Put

LORA_KEY = "model.lora_configs"
TINKER = "model.tinker."
_DEFAULTS = {"lora_rank": 32, "lora_alpha": 32, "target_modules": "all-linear"}  # Trinity-RFT's LoRAConfig
_NAMES_ONLY = ("name", "base_model_name")  # how Trinity-RFT names the adapter to its servers: rlkit names it itself
_KNOWN = {*_DEFAULTS, *_NAMES_ONLY, "path", "lora_dtype"}


def lora_adapters(leaves: dict[str, Any], moved: Moved, left: Left, put: Put, problems: Problems,
                  source: str) -> set[str]:
    """Move model.lora_configs' one adapter to actor.use_lora and its fields; judge Tinker's keys. Returns the keys
    judged here."""
    tinker = [key for key in leaves if key.startswith(TINKER)]
    if leaves.get(f"{TINKER}enable") is True:
        problems.add(f"{TINKER}enable true ({source}): Tinker trains through a remote service; rlkit trains on the "
                     "job's own GPUs", hint="leave model.tinker out and give the adapter in model.lora_configs "
                                            "(rlkit's actor.use_lora)")
    else:
        for key in tinker:
            left(key, "Tinker is off")
    spread = [key for key in leaves if key.startswith(f"{LORA_KEY}.")]  # a mapping: flattened into its fields
    if spread:
        problems.add(f"{LORA_KEY} ({source}): a mapping, where Trinity-RFT takes a list of adapters",
                     hint="write it as a list of one: lora_configs: [{lora_rank: 32, ...}]")
        return {*spread, *tinker}
    if LORA_KEY not in leaves:
        return set(tinker)
    adapters = leaves[LORA_KEY]
    if adapters in (None, []):
        left(LORA_KEY, "no adapter: the whole model is trained, rlkit's default")
        return {LORA_KEY, *tinker}
    problem = _problem(adapters)
    if problem:
        problems.add(f"{LORA_KEY} ({source}): {problem}", hint="give one adapter: - {lora_rank: 32, lora_alpha: "
                                                               "32, target_modules: all-linear} (or remove the key "
                                                               "to train the whole model)")
        return {LORA_KEY, *tinker}
    adapter = {**_DEFAULTS, **adapters[0]}
    modules = adapter["target_modules"]
    modules = [m.strip() for m in modules.split(",") if m.strip()] if isinstance(modules, str) else list(modules)
    put("actor.use_lora", True)
    put("actor.lora_rank", adapter["lora_rank"])
    put("actor.lora_alpha", adapter["lora_alpha"])
    moved(LORA_KEY, "actor.target_modules", modules,
          f" (and actor.use_lora: true, lora_rank {adapter['lora_rank']}, lora_alpha {adapter['lora_alpha']}"
          f"{_unread(adapter)})")
    return {LORA_KEY, *tinker}


def _problem(adapters: Any) -> str:
    """Why model.lora_configs is not one adapter rlkit can train, or ""."""
    if not isinstance(adapters, list):
        return f"a {type(adapters).__name__}, where Trinity-RFT takes a list of adapters"
    if len(adapters) > 1:
        return f"{len(adapters)} adapters: rlkit trains one (as Trinity-RFT does today)"
    adapter = adapters[0]
    if not isinstance(adapter, dict):
        return f"its adapter is a {type(adapter).__name__}, not a mapping of lora_rank, lora_alpha, target_modules"
    if adapter.get("path"):
        return ("the adapter starts from a trained one (path): rlkit draws a fresh adapter; continuing one is "
                "not built")
    modules = adapter.get("target_modules", _DEFAULTS["target_modules"])
    if not isinstance(modules, str) and not (isinstance(modules, list) and modules
                                             and all(isinstance(m, str) for m in modules)):
        return "its target_modules is neither a module name (all-linear) nor a list of names"
    return ""


def _unread(adapter: dict[str, Any]) -> str:
    """What of the adapter's other fields is left out, for the fate's line."""
    said = [f"{name} left out (rlkit names its adapter itself)" for name in _NAMES_ONLY if adapter.get(name)]
    dtype = adapter.get("lora_dtype", "auto")
    if dtype not in (None, "auto"):
        said.append(f"lora_dtype {str(dtype)[:20]} left out (rlkit trains the adapter in float32, as the trainer's "
                    "master weights)")
    said += [f"{str(name)[:40]} left out (not one of Trinity-RFT's LoRA fields)" for name in adapter
             if name not in _KNOWN]
    return "".join(f"; {s}" for s in said)
