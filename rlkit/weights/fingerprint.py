"""The proof that a server serves the trainer's weights: its logprobs of a fixed token sequence against the trainer's.

A version number reported by a server says only that a version was set, not which weights produce its logits (see
the tied-embedding note in `rlkit.servers.vllm.worker`).
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from rlkit.errors import StepError
from rlkit.servers.backend import Server, backend_for
from rlkit.servers.vllm.command import RELOAD_METHOD, WORKER_EXTENSION


async def probe_logprobs(
    client: httpx.AsyncClient, server: Server, probe_ids: list[int], *, timeout: float = 60.0
) -> list[float]:
    """The server's logprob of each probe token given the tokens before it: `len(probe_ids) - 1` values (the first
    token has no logprob), asked the server's own way (`ServerBackend.probe_logprobs`)."""
    if len(probe_ids) < 2:
        raise ValueError("a probe needs at least 2 tokens (the first one has no logprob)")
    return await backend_for(server.backend).probe_logprobs(client, server, probe_ids, timeout)


def trainer_probe_logprobs(model: Any, probe_ids: list[int]) -> list[float]:
    """The same numbers as `probe_logprobs` from a transformers causal LM: log_softmax in float32, token i given 0..i-1.

    Runs in eval mode (no dropout) under `torch.no_grad()` and restores the training mode. An FSDP-sharded model
    must be called on every rank, as any forward.
    """
    import torch

    if len(probe_ids) < 2:
        raise ValueError("a probe needs at least 2 tokens (the first one has no logprob)")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([probe_ids], device=device)).logits[0].float()
    finally:
        model.train(was_training)
    logprobs = torch.log_softmax(logits[:-1], dim=-1)
    targets = torch.tensor(probe_ids[1:], device=logits.device)
    return logprobs.gather(1, targets[:, None])[:, 0].cpu().tolist()


def check_fingerprint(server_lp: list[float], trainer_lp: list[float], tolerance: float, *, server_label: str) -> float:
    """Mean |server - trainer| over the probe tokens; StepError (mean, max, tolerance, likely causes) above `tolerance`.

    Float32 serving of the same weights matches to ~1e-5; bfloat16 serving differs by ~1e-2, so the tolerance must
    fit the server's `--dtype`.
    """
    if len(server_lp) != len(trainer_lp) or not server_lp:
        raise StepError(f"{server_label}: {len(server_lp)} server logprobs against {len(trainer_lp)} trainer "
                        "logprobs: not the same probe")
    diffs = [abs(s - t) for s, t in zip(server_lp, trainer_lp, strict=True)]
    mean, worst = sum(diffs) / len(diffs), max(diffs)
    if math.isnan(mean) or mean > tolerance:
        raise StepError(
            f"{server_label} does not serve the trainer's weights: its probe logprobs differ from the trainer's by "
            f"{mean:.3g} on average (max {worst:.3g}) over {len(diffs)} tokens; tolerance {tolerance:g}.\n"
            "  fix: if the model ties its embeddings (tie_word_embeddings) and the server is vLLM, it must load "
            f"through rlkit's code (disk: the worker extension, {RELOAD_METHOD}, --worker-extension-cls "
            f"{WORKER_EXTENSION}; xccl: rlkit's gloo engine): vLLM 0.32's own load leaves the output head stale. A "
            "small difference everywhere is a dtype gap (a bfloat16 server against a float32 trainer): raise the "
            "tolerance or serve in the trainer's dtype. Also check that the server loaded what the trainer sent (the "
            "weights directory, or the broadcast's version; with actor.use_lora the adapter directory, whose adapter "
            "the probe names) and that both use the same tokenizer."
        )
    return mean
