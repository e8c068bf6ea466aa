"""The teacher's scores of the student's samples (job type distill, trainer rank 0): for every sample, the teacher's
log-prob of each completion token and, with distill.topk, its top-k per position.

The teacher is an auxiliary model (rlkit.rewards.auxiliary): its servers are found in name resolve under
`auxiliary/<distill.teacher>/<i>`, and every request carries the trial's bearer token (the token guard every rlkit
server proves at start, rlkit.servers.guard_check). Samples go in batches of distill.request_batch sequences per
request (the servers' prompt-logprob route, rlkit.servers.scoring), the batches side by side over the teacher's
servers (at most rollout.max_concurrent_rollouts in flight), each with rollout.request_timeout and
rollout.request_retries, a failed batch retried on another server, as the rollouts are. Torch-free.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import httpx

from rlkit.errors import StepError
from rlkit.servers.backend import Server, TokenScores, backend_for
from rlkit.servers.http import server_client
from rlkit.types import Sample

if TYPE_CHECKING:
    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.nameresolve.base import NameResolve


def score_batches(samples: Sequence[Sample], size: int) -> list[list[int]]:
    """Indices of `samples` per request: `size` at a time, in order (dummies are never scored)."""
    real = [i for i, s in enumerate(samples) if not s.dummy]
    return [real[k:k + size] for k in range(0, len(real), size)]


def attach(sample: Sample, scores: TokenScores, topk: int) -> None:
    """Put the teacher's scores of `sample`'s completion on it (what the trainer's loss reads)."""
    n = len(sample.completion_ids)
    if len(scores.logprobs) != n or (topk and len(scores.topk) != n):
        raise StepError(f"the teacher scored {len(scores.logprobs)} tokens of a completion of {n}")
    sample.teacher_logp = list(scores.logprobs)
    sample.teacher_topk = [list(p) for p in scores.topk] if topk else None


class TeacherScorer:
    """Scores batches of samples with the teacher's servers; one per trainer rank 0."""

    def __init__(self, servers: list[Server], token: str, *, topk: int, request_batch: int, timeout: float,
                 retries: int, max_in_flight: int) -> None:
        if not servers:
            raise StepError("no teacher server to score samples with")
        self.servers, self.token = servers, token
        self.topk, self.request_batch = topk, request_batch
        self.timeout, self.retries, self.max_in_flight = timeout, retries, max_in_flight
        self.requests = 0  # scoring requests sent (retries included), for the step's metrics
        self.failures = 0
        self._next = itertools.cycle(range(len(servers)))

    @classmethod
    def for_trial(cls, config: ExperimentConfig, nr: NameResolve, token: str) -> TeacherScorer:
        """The scorer of the config's teacher, once all its servers answer /health."""
        from rlkit.servers.pool import wait_for_servers

        name = config.distill.teacher
        entry = next(e for e in config.auxiliary_models if e.name == name)  # checked at submit
        servers = wait_for_servers(nr, entry.engine_num, config.rollout.setup_timeout, healthy=True, auxiliary=name)
        rollout = config.rollout
        return cls(servers, token, topk=config.distill.topk or 0, request_batch=config.distill.request_batch,
                   timeout=rollout.request_timeout, retries=rollout.request_retries,
                   max_in_flight=rollout.max_concurrent_rollouts)

    def score(self, samples: Sequence[Sample]) -> None:
        """Every (non-dummy) sample gets its teacher scores; StepError if a batch fails on every try."""
        asyncio.run(self._score(samples))

    async def _score(self, samples: Sequence[Sample]) -> None:
        limit = asyncio.Semaphore(self.max_in_flight)
        async with server_client(self.token, max_connections=self.max_in_flight + len(self.servers)) as client:
            async def one(batch: list[int]) -> None:
                async with limit:
                    scored = await self._with_retries(client, [samples[i] for i in batch])
                for i, scores in zip(batch, scored, strict=True):
                    attach(samples[i], scores, self.topk)

            await asyncio.gather(*(one(b) for b in score_batches(samples, self.request_batch)))

    async def _with_retries(self, client: httpx.AsyncClient, batch: list[Sample]) -> list[TokenScores]:
        sequences = [s.prompt_ids + s.completion_ids for s in batch]
        starts = [len(s.prompt_ids) for s in batch]
        errors: list[str] = []
        for _attempt in range(self.retries + 1):
            server = self.servers[next(self._next)]
            self.requests += 1
            try:
                return await backend_for(server.backend).score_tokens(client, server, sequences, starts, self.topk,
                                                                      self.timeout)
            except StepError as exc:
                self.failures += 1
                errors.append(str(exc))
        raise StepError(f"the teacher could not score a batch of {len(batch)} samples in {self.retries + 1} "
                        f"tries; last: {errors[-1]}")
