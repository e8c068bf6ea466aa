"""The proof that a server serves the trainer's weights: its logprobs of a fixed token sequence against the trainer's.

A version number reported by a server says only that a version was set, not which weights produce its logits (see
the tied-embedding note in `rlkit.servers.vllm.worker`).
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from rlkit.errors import StepError
from rlkit.rollout.client import Server
from rlkit.servers.vllm.command import WORKER_EXTENSION
from rlkit.weights.server_http import answer_json, call, server_label

RELOAD_METHOD = "rlkit_reload_weights"  # rlkit.servers.vllm.worker.WeightSyncExtension.rlkit_reload_weights


async def probe_logprobs(
    client: httpx.AsyncClient, server: Server, probe_ids: list[int], *, timeout: float = 60.0
) -> list[float]:
    """The server's logprob of each probe token given the tokens before it: `len(probe_ids) - 1` values.

    The first token has no logprob (nothing precedes it).

    vLLM: `POST /v1/completions {"prompt": probe_ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}`;
    `choices[0].prompt_logprobs` is `[null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]`, raw logprobs of the
    model's logits (no sampling settings applied). SGLang (not run here): `POST /generate` with `input_ids`,
    `return_logprob` and `logprob_start_len=0`; `meta_info.input_token_logprobs` is `[[logprob|null, id, text], ...]`.
    """
    if len(probe_ids) < 2:
        raise ValueError("a probe needs at least 2 tokens (the first one has no logprob)")
    what = "probe logprobs"
    if server.backend == "sglang":
        body: dict[str, Any] = {"input_ids": probe_ids, "sampling_params": {"temperature": 0, "max_new_tokens": 1},
                                "return_logprob": True, "logprob_start_len": 0}
        response = await call(client, server, "POST", "/generate", what, timeout, json=body)
        entries = answer_json(response, server, what)["meta_info"]["input_token_logprobs"]
        values = [entry[0] for entry in entries[1:]]
        ids = [entry[1] for entry in entries[1:]]
    else:
        body = {"model": server.model, "prompt": probe_ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
        response = await call(client, server, "POST", "/v1/completions", what, timeout, json=body)
        entries = answer_json(response, server, what)["choices"][0]["prompt_logprobs"]
        ids = list(probe_ids[1:])
        values = [(entry or {}).get(str(token), {}).get("logprob")
                  for entry, token in zip(entries[1:], ids, strict=False)]
    if len(values) != len(probe_ids) - 1 or ids != list(probe_ids[1:]) or any(v is None for v in values):
        raise StepError(f"{server_label(server)}: {what} do not cover the {len(probe_ids) - 1} probe tokens: "
                        f"{response.text[:500]}")
    return [float(v) for v in values]


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
            "  fix: if the model ties its embeddings (tie_word_embeddings), the server must reload through rlkit's "
            f"worker extension ({RELOAD_METHOD}, --worker-extension-cls {WORKER_EXTENSION}): vLLM 0.32's plain "
            "reload_weights leaves the output head stale. A small difference everywhere is a dtype gap (server "
            "--dtype bfloat16 against a float32 trainer): raise the tolerance or serve in the trainer's dtype. Also "
            "check that the server reloaded the directory the trainer wrote (weights_dir) and that both use the same "
            "tokenizer."
        )
    return mean
