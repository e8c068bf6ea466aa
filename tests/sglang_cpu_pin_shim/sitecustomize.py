"""TEST-ONLY: host-memory pinning as a no-op on a machine without CUDA, for SGLang 0.5.23's LoRA path on the CPU.

Why: SGLang 0.5.23's LoRA layers and its `torch_native` LoRA backend pin host tensors unconditionally
(sglang/srt/lora/layers.py: `torch.tensor(..., pin_memory=True)`, `.cpu().pin_memory()`;
sglang/srt/lora/backend/torch_backend.py: `.pin_memory()`, `torch.zeros(..., pin_memory=True)`), and torch refuses to
pin without an NVIDIA driver ("Found no NVIDIA driver on your system"), so a CPU server with `--enable-lora` dies at
start. Pinning only makes later host-to-GPU copies asynchronous; on a CPU-only server there is no such copy, and a
pinned tensor holds the same values as an unpinned one: making it a no-op changes no number the server computes.

Loaded by Python at start-up (`sitecustomize`) in every process of the one server whose PYTHONPATH puts this
directory first (tests/helpers/sglang_helpers.py, LoRA servers only). Does nothing where CUDA is available. Never
shipped.
"""

from __future__ import annotations

import functools
from typing import Any


def _install() -> None:
    import torch

    if torch.cuda.is_available():
        return

    def unpinned(factory: Any) -> Any:
        @functools.wraps(factory)
        def make(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop("pin_memory", None)
            return factory(*args, **kwargs)

        return make

    for name in ("tensor", "empty", "zeros", "ones", "full", "arange", "empty_like", "zeros_like", "ones_like",
                 "full_like", "as_tensor"):
        if hasattr(torch, name):
            setattr(torch, name, unpinned(getattr(torch, name)))
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    torch.Tensor.is_pinned = lambda self, *args, **kwargs: False  # type: ignore[method-assign]


_install()
