"""bench/bench_gpu.py's throughput sections (items 2 and 5 of its docstring): the grpo actor's step through
rlkit's PPOActor at given sequence lengths, tokens/s, MFU and the measured step's own peak memory."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from gpu_steps import PAD, actor_config, free, grpo_step, peak_gb, samples, timed


def throughput(model: Path, vocab: int, n_params: int, peak_tflops: float, lengths: list[int], tokens: int,
               device: Any, *, gc_modes: tuple[bool, ...] = (False, True), chunk_tokens: int | None = None,
               tag: str = "") -> dict[str, Any]:
    """Items 2 and 5: the grpo actor's step on `tokens` tokens per step (a quarter prompt), after one warm-up step;
    its peak is the measured step's alone. A micro-batch holds `tokens` up to 8k, or one sequence when longer."""
    from rlkit.trainer.actor import PPOActor

    results: dict[str, Any] = {}
    for gc_on in gc_modes:
        free(device)
        config = actor_config(model, gc_on=gc_on, mb_tokens=max(min(tokens, 8192), max(lengths)),
                              chunk_tokens=chunk_tokens)
        actor = PPOActor.build(config, rank=0, world=1, device=device, pad_id=PAD, temperature=1.0,
                               total_optimizer_steps=100)
        for length in lengths:
            key = f"seq{length}_gc{int(gc_on)}{tag}"
            n = max(1, tokens // length)
            try:
                grpo_step(actor, samples(max(2, n), length // 4, length - length // 4, vocab, 4))  # warm-up
                batch = samples(n, length // 4, length - length // 4, vocab, 5)
                old = actor.logprobs_at(batch)
                for i, s in enumerate(batch):
                    s.behav_logp = old[i]
                free(device)
                _, seconds = timed(functools.partial(actor.train_step, batch, old, None), device)
                rate = n * length / seconds
                results[key] = {"sequences": n, "tokens": n * length, "train_step_s": round(seconds, 3),
                                "tokens_per_s": round(rate),
                                "mfu": round(6 * n_params * rate / (peak_tflops * 1e12), 4),
                                "peak_gb": peak_gb(device), "logprob_chunk_tokens": config.logprob_chunk_tokens,
                                "packing": config.mb_spec.packing}
            except Exception as e:
                results[key] = {"error": f"{type(e).__name__}: {e}"[:1000]}
            print(f"throughput {key}: {json.dumps(results[key])}", flush=True)
            free(device)
        del actor
    return results


def long_sequences(model: Path, vocab: int, n_params: int, peak_tflops: float, tiny: bool,
                   device: Any) -> dict[str, Any]:
    """Item 5: 8k and 32k tokens a sequence (tiny: 1k and 4k), 32k tokens a step, packed and chunked, with and
    without checkpointing; then the shorter length with the full logits, checkpointing on (the head's share)."""
    lengths, tokens = ([1024, 4096], 4096) if tiny else ([8192, 32768], 32768)
    results = throughput(model, vocab, n_params, peak_tflops, lengths, tokens, device)
    results.update(throughput(model, vocab, n_params, peak_tflops, lengths[:1], tokens, device, gc_modes=(True,),
                              chunk_tokens=0, tag="_full_logits"))
    chunked, full = results.get(f"seq{lengths[0]}_gc1", {}), results.get(f"seq{lengths[0]}_gc1_full_logits", {})
    if chunked.get("peak_gb") and full.get("peak_gb"):
        results["full_over_chunked_peak"] = round(full["peak_gb"] / chunked["peak_gb"], 3)
    return results
