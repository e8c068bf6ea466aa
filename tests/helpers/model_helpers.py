"""A Hugging Face model with seeded noise on its weights: what a weight push must make a server serve (the weight-sync
and SGLang tests, bench/bench_xccl.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def perturbed(model_dir: Path, seed: int, scale: float = 0.05) -> Any:
    """The float32 model in `model_dir` with `scale` x N(0, 1) noise added to every parameter (a tied weight is one
    parameter, so it stays tied)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    return model
