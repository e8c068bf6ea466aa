"""What bench/bench_gpu.py's sections share: the bench actor's config, random GRPO samples, one GRPO step in the
loop's order, and the device's clock and peak memory."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PAD = 0


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def actor_config(path: Path, *, gc_on: bool = False, lora: bool = False, mb_tokens: int = 8192,
                 chunk_tokens: int | None = None) -> Any:
    """The bench's actor; `chunk_tokens` None keeps actor.logprob_chunk_tokens' default, 0 is the full logits."""
    from rlkit.config.schema.actor import ActorConfig, MicroBatchSpec, OptimizerConfig

    config = ActorConfig(path=str(path), dtype="bfloat16", attn_impl="sdpa", gradient_checkpointing=gc_on,
                         group_size=2, ppo_n_minibatches=1, mb_spec=MicroBatchSpec(max_tokens_per_mb=mb_tokens),
                         optimizer=OptimizerConfig(lr=1e-6, warmup_steps_proportion=0.0), use_lora=lora,
                         lora_rank=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    if chunk_tokens is not None:
        config.logprob_chunk_tokens = chunk_tokens
    return config


def samples(n: int, prompt: int, completion: int, vocab: int, seed: int) -> list[Any]:
    """`n` random GRPO samples in groups of 2 with advantages +-1 (behaviour log-probs filled in later)."""
    import torch

    from rlkit.types import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(1, vocab, (prompt + completion,), generator=g).tolist()
        out.append(Sample(ids[:prompt], ids[prompt:], [0.0] * completion, float(i % 2), 0, True, i // 2,
                          advantage=1.0 if i % 2 else -1.0))
    return out


def grpo_step(actor: Any, batch: list[Any]) -> dict[str, float]:
    """The loop's order: the proximal log-probs recomputed (they stand in for the servers' too), then the update."""
    old = actor.logprobs_at(batch)
    for i, s in enumerate(batch):
        s.behav_logp = old[i]
    return dict(actor.train_step(batch, old, None))


def free(device: Any) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device: Any) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def timed(fn: Callable[[], Any], device: Any) -> tuple[Any, float]:
    sync(device)
    started = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - started
