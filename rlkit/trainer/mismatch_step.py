"""The trainer side of the per-step log-prob mismatch check (rlkit.trainer.mismatch): which log-probs, on which ranks.

Collective: every rank measures its own share of the batch and rank 0 receives the sum per server.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.servers.sampled_logprobs import sampled_logprob_meaning
from rlkit.trainer.actor import PPOActor
from rlkit.trainer.mismatch import ServerMismatch, compared_indices, comparison_temperature, measure, merge
from rlkit.types import Sample


def step_mismatch(engine: PPOActor, samples: Sequence[Sample], recomputed: dict[int, list[float]] | None, *,
                  version: int, temperature: float) -> dict[int, ServerMismatch] | None:
    """Per server, |trainer - server| over the completion tokens sampled at `version`, the version the trainer holds
    (before its update; inserted tokens never count); on rank 0, None on the other ranks. Collective.

    The trainer's log-probs are taken at `temperature` (`mismatch.comparison_temperature`): the step's recomputed
    log-probs (`recomputed`, at the sampling temperature) when they are at that temperature, else one more forward
    over the compared samples only.
    """
    indices = compared_indices(samples, version)  # the same on every rank: the batch was broadcast
    part: dict[int, ServerMismatch] = {}
    if indices:
        if recomputed is not None and temperature == engine.temperature:
            trainer_logp = recomputed
        else:
            subset = engine.logprobs_at([samples[i] for i in indices], temperature=temperature)
            trainer_logp = {indices[j]: values for j, values in subset.items()}
        part = measure(samples, trainer_logp, version)
    rank0 = dist.get_rank() == 0
    parts: list[dict[int, ServerMismatch] | None] = [None] * dist.get_world_size() if rank0 else []
    dist.gather_object(part, parts if rank0 else None, dst=0)
    return merge(p for p in parts if p is not None) if rank0 else None


def mismatch_temperature(config: ExperimentConfig, *, announce: bool) -> float | None:
    """The temperature the log-prob mismatch check computes the trainer's log-probs at; None (said once, by the rank
    that `announce`s) when the servers' log-probs cannot be reproduced."""
    g = config.gconfig
    meaning = sampled_logprob_meaning(config)
    temperature = comparison_temperature(meaning, g.temperature, top_p=g.top_p, top_k=g.top_k)
    if temperature is None and announce:
        what = ("logits, not log-probs" if meaning == "logits" else
                f"log-probs after top-p/top-k truncation (gconfig.top_p {g.top_p}, top_k {g.top_k})")
        print(f"rlkit train: the servers return {what}, which the trainer does not reproduce: no log-prob mismatch "
              "check", flush=True)
    return temperature
