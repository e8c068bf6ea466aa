"""The per-step check that the servers sample from the trainer's weights: trainer vs server log-probs of rollout tokens.

The fingerprint (rlkit.weights.fingerprint) proves a server holds the pushed weights once, right after a push, on one
probe sequence. This check runs on every step's real rollout tokens: whatever happens to a server between pushes
(stale prefix cache, a partial reload, weights changed behind the version number) shows as a difference between the
log-probs it returned with the tokens and the log-probs the trainer computes for the same tokens.

Only tokens sampled at the version the trainer holds before the step's update count: older ones differ
legitimately (the weights moved since). Tokens rlkit inserted into a multi-turn episode (tool results, template glue)
have no server log-prob and are never compared (rlkit.trainer.sampled_tokens). Pure (no torch): the trainer's log-probs
come in as lists; each trainer rank measures its own samples (`measure`), rank 0 adds the parts up (`merge`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rlkit.trainer.sampled_tokens import positions_at
from rlkit.types import Sample

METRIC = "weight_sync/logprob_mismatch"  # <METRIC>_mean, _max, _tokens; per server <METRIC>_mean/server<i>, ...


@dataclass(frozen=True)
class ServerMismatch:
    """|trainer - server| log-prob statistics of one server's tokens."""

    server: int
    tokens: int
    abs_sum: float
    max: float

    @property
    def mean(self) -> float:
        return self.abs_sum / self.tokens if self.tokens else 0.0

    def plus(self, other: ServerMismatch) -> ServerMismatch:
        return ServerMismatch(self.server, self.tokens + other.tokens, self.abs_sum + other.abs_sum,
                              max(self.max, other.max))


def comparison_temperature(meaning: str, sampling_temperature: float, *, top_p: float, top_k: int) -> float | None:
    """The temperature the trainer must apply to its logits to reproduce the log-probs the servers return (`meaning`,
    rlkit.servers.sampled_logprobs), or None when no temperature does.

    "raw" log-probs (vLLM's default) are log_softmax(logits) whatever the sampling temperature: compare at 1.0.
    "temperature" ones are log_softmax(logits / T) of the sampling distribution, after top-p/top-k truncation and
    renormalisation, which the trainer does not reproduce: comparable only without truncation. "logits" are no
    log-probs.
    """
    if meaning == "raw":
        return 1.0
    if meaning == "temperature" and top_p >= 1.0 and top_k <= 0:
        return sampling_temperature
    return None


def compared_indices(samples: Sequence[Sample], version: int) -> list[int]:
    """Indices of the samples the check uses: real samples of a known server with tokens it sampled at `version`."""
    out = []
    for i, s in enumerate(samples):
        if s.server >= 0 and not s.dummy and positions_at(s, version):
            out.append(i)
    return out


def measure(samples: Sequence[Sample], trainer_logp: Mapping[int, Sequence[float]],
            version: int) -> dict[int, ServerMismatch]:
    """Per server, the statistics over the completion tokens of the samples in `trainer_logp` (global index ->
    the trainer's log-probs of that sample's whole completion) that the server sampled at `version`: a multi-turn
    episode's inserted tokens have no server log-prob, and its turns before a weight update legitimately differ."""
    wanted = set(compared_indices(samples, version))
    out: dict[int, ServerMismatch] = {}
    for i, trainer in trainer_logp.items():
        if i not in wanted:
            continue
        s = samples[i]
        if len(trainer) != len(s.behav_logp):
            raise ValueError(f"sample {i}: {len(trainer)} trainer log-probs for {len(s.behav_logp)} server ones")
        diffs = [abs(trainer[j] - s.behav_logp[j]) for j in positions_at(s, version)]
        if not diffs:
            continue
        part = ServerMismatch(s.server, len(diffs), sum(diffs), max(diffs))
        out[s.server] = out[s.server].plus(part) if s.server in out else part
    return out


def merge(parts: Iterable[Mapping[int, ServerMismatch]]) -> dict[int, ServerMismatch]:
    """The statistics of several ranks' parts, per server."""
    out: dict[int, ServerMismatch] = {}
    for part in parts:
        for server, m in part.items():
            out[server] = out[server].plus(m) if server in out else m
    return dict(sorted(out.items()))


def metrics(per_server: Mapping[int, ServerMismatch]) -> dict[str, float]:
    """The step's metrics: overall mean/max/tokens and the same per server. Without compared tokens (every sample of
    the batch older than the trainer's version) only the token count (0) is logged: a 0 mean would claim a match."""
    tokens = sum(m.tokens for m in per_server.values())
    out: dict[str, float] = {f"{METRIC}_tokens": float(tokens)}
    if tokens:
        out[f"{METRIC}_mean"] = sum(m.abs_sum for m in per_server.values()) / tokens
        out[f"{METRIC}_max"] = max(m.max for m in per_server.values())
    for server, m in per_server.items():
        if m.tokens:
            out[f"{METRIC}_mean/server{server}"] = m.mean
            out[f"{METRIC}_max/server{server}"] = m.max
            out[f"{METRIC}_tokens/server{server}"] = float(m.tokens)
    return out


def warnings(per_server: Mapping[int, ServerMismatch], *, threshold: float, version: int,
             addresses: Mapping[int, str]) -> list[str]:
    """One line per server whose mean mismatch exceeds `threshold`, naming it, its address and the version."""
    return [f"server {server} ({addresses.get(server, 'address unknown')}) log-probs differ from the trainer's by "
            f"{m.mean:.3g} (max {m.max:.3g}) at version {version} over {m.tokens} tokens; threshold "
            f"actor.logprob_mismatch_warn={threshold:g}. The server may not serve the weights of its version: see "
            f"its log (rlkit logs TRIAL --step server-{server})"
            for server, m in per_server.items() if m.tokens and m.mean > threshold]
