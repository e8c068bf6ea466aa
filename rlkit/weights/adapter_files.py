"""LoRA adapters as files: the peft directory (adapter_config.json + adapter_model.safetensors) that vLLM's and
SGLang's runtime LoRA loaders read, and peft's names for adapter parameters. Here, below the trainer, because both the
trainer (wrap, checkpoints) and the LoRA weight transport (rlkit.weights.lora_disk) write or name adapters; peft and
safetensors are imported inside the functions that need them (trainer side only).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peft import LoraConfig
    from torch import Tensor

    from rlkit.config.schema.actor import ActorConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
LORA_MARK = ".lora_"  # peft's LoRA parameters: <module>.lora_A.<adapter>.weight, <module>.lora_B.<adapter>.weight


def lora_config(actor: ActorConfig, *, base_model: str | None = None) -> LoraConfig:
    """peft's LoraConfig from the actor's fields (no dropout: the trainer's log-probs must be the servers')."""
    from peft import LoraConfig

    modules: list[str] | str = list(actor.target_modules)
    if modules == ["all-linear"]:
        modules = "all-linear"  # peft's own shorthand: every linear layer but the output head
    return LoraConfig(r=actor.lora_rank, lora_alpha=actor.lora_alpha, target_modules=modules, lora_dropout=0.0,
                      bias="none", task_type="CAUSAL_LM", base_model_name_or_path=base_model)


def is_adapter_param(name: str) -> bool:
    """A LoRA parameter of a peft model (or a saved adapter), by peft's naming."""
    return LORA_MARK in name


def target_modules_of(tensors: dict[str, Tensor]) -> list[str]:
    """The module names (last path element) that carry an adapter in a saved adapter state."""
    return sorted({name.split(LORA_MARK)[0].rsplit(".", 1)[-1] for name in tensors if LORA_MARK in name})


def write_adapter(tensors: dict[str, Tensor], actor: ActorConfig, base_model: str, out_dir: Path) -> Path:
    """Write one adapter as a peft directory: adapter_model.safetensors (the tensors, as named by
    rlkit.trainer.lora.iter_adapter_buckets) and adapter_config.json (rank, alpha and the modules actually adapted,
    so an 'all-linear' config is written as the list it resolved to). The files are world-readable: a server running
    as another user must read them (peft's own save writes 0600). The directory must not exist yet (a server caches
    an adapter by its path, so a version is never rewritten in place)."""

    from safetensors.torch import save_file

    if not tensors:
        raise ValueError("an adapter with no tensors")
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists: an adapter directory is never rewritten (servers cache by path)")
    # `.<name>.<pid>.tmp`: the pattern rlkit.weights.hf_export.remove_old_versions cleans up after a crash
    partial = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.tmp")
    partial.mkdir(parents=True, exist_ok=False)
    config: dict[str, Any] = lora_config(actor, base_model=base_model).to_dict()
    config["target_modules"] = target_modules_of(tensors)
    config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
    (partial / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(partial / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})
    for path in (partial / ADAPTER_CONFIG, partial / ADAPTER_WEIGHTS):
        os.chmod(path, 0o644)
    os.chmod(partial, 0o755)
    partial.rename(out_dir)  # complete or absent: a server never sees half an adapter
    return out_dir
