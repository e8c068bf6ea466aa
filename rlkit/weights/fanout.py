"""Publishing a weight version to every server, whatever the transport: the push (rlkit.weights.base), then the
version each server reports and its fingerprint (rlkit.weights.fingerprint), then the lost-server policy.

The policy: a server whose process is gone (connection refused or dropped, at any phase) is put on the lost list and
the run goes on with the others, as long as one is left (a restarted server gets the weights before any request);
every other failure is collected and raised together, naming each server. Every server is handled whatever the
others do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlkit.errors import StepError
from rlkit.servers.backend import Server, backend_for
from rlkit.servers.http import ServerUnreachable, timed
from rlkit.weights.base import Buckets, PushTargets, ServerOutcome, ServerSync, WeightTransport, outcome_of
from rlkit.weights.fingerprint import check_fingerprint, probe_logprobs

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Probe:
    """The fingerprint to check: probe token ids, the trainer's log-probs of them, the allowed mean difference, and
    how long the probe may wait in the server's queue on top of the push's timeout."""

    ids: list[int]
    trainer_lp: list[float]
    tolerance: float
    # The probe is a request like any other, sent once the server has resumed: a server at its max_num_seqs takes it
    # first come, first served, behind generation requests that each end within rollout.request_timeout. A probe
    # timed out there fails a healthy server (and the step), so rank 0 passes that timeout here.
    queue_s: float = 0.0


@dataclass
class Published:
    """Rank 0's view of a published version: the servers that serve it (checked) and those found gone."""

    synced: list[ServerSync]
    lost: list[Server] = field(default_factory=list)


def publish(transport: WeightTransport, buckets: Buckets, version: int, targets: PushTargets | None,
            probe: Probe | None) -> Published | None:
    """Collective (every trainer rank, `targets` on rank 0 only): push `version` through `transport`, then on rank 0
    check every delivered server's version and (given `probe`) fingerprint, and apply the lost-server policy.

    Returns None off rank 0. Raises StepError listing every failed server, ServerUnreachable if every server is
    gone."""
    outcomes = transport.push(buckets, version, targets)
    if targets is None:
        return None
    if outcomes is None:
        raise StepError(f"the {transport.name} transport returned no outcome on trainer rank 0")

    async def check() -> list[ServerOutcome]:
        async with targets.open_client() as client:
            return await check_all(client, outcomes, version, targets.timeout, probe, guard=targets.guard)

    what = (f"checking weight version {version} on {len(outcomes)} servers (version, fingerprint; limit: 2 x "
            "actor.weight_update_timeout + 60 s + the probe's queue, rollout.request_timeout)")
    queue_s = probe.queue_s if probe is not None else 0.0
    return settle(targets.run(check(), timeout=2 * targets.timeout + 60 + queue_s, what=what), version,
                  tolerate_lost=True)


def verify(targets: PushTargets, probe: Probe) -> Published:
    """Before any push (the trainer's first weights): every server must pass the fingerprint; nothing is lost."""

    async def check() -> list[ServerOutcome]:
        outcomes = [ServerOutcome(s, sync=ServerSync(index=s.index, address=s.address, version=0))
                    for s in targets.servers]
        async with targets.open_client() as client:
            return await check_all(client, outcomes, None, targets.timeout, probe)

    what = (f"the fingerprint check of the first weights on {len(targets.servers)} servers (limit: "
            "actor.weight_update_timeout + 60 s + the probe's queue, rollout.request_timeout)")
    return settle(targets.run(check(), timeout=targets.timeout + 60 + probe.queue_s, what=what), 0,
                  tolerate_lost=False)


async def check_server(client: httpx.AsyncClient, server: Server, sync: ServerSync, version: int | None,
                       timeout: float, probe: Probe | None) -> ServerSync:
    """The server must report `version` (unless None) and, given `probe`, pass the fingerprint. Phases:
    check_version, probe."""
    backend = backend_for(server.backend)
    started = time.monotonic()
    if version is not None:
        reported = await timed(sync.phases, "check_version", backend.read_version(client, server, timeout))
        if reported != str(version):
            raise StepError(f"{server.label}: reports weight version {reported!r} after the sync, not {version}")
    if probe is not None:
        server_lp = await timed(sync.phases, "probe", probe_logprobs(client, server, probe.ids,
                                                                     timeout=timeout + probe.queue_s))
        sync.fingerprint = check_fingerprint(server_lp, probe.trainer_lp, probe.tolerance, server_label=server.label)
    sync.seconds += time.monotonic() - started
    return sync


async def check_all(client: httpx.AsyncClient, outcomes: Sequence[ServerOutcome], version: int | None,
                    timeout: float, probe: Probe | None,
                    guard: Callable[[Server, Awaitable[Any]], Awaitable[Any]] = lambda server, call: call
                    ) -> list[ServerOutcome]:
    """`check_server` on every synced server at once (each under `guard`: PushTargets.guard); the others' outcomes
    are kept as they are."""

    async def one(outcome: ServerOutcome) -> ServerOutcome:
        if outcome.sync is None:
            return outcome
        try:
            return ServerOutcome(outcome.server, sync=await guard(outcome.server, check_server(
                client, outcome.server, outcome.sync, version, timeout, probe)))
        except Exception as exc:
            return outcome_of(outcome.server, exc)

    return list(await asyncio.gather(*(one(o) for o in outcomes)))


def settle(outcomes: Sequence[ServerOutcome], version: int, *, tolerate_lost: bool) -> Published:
    """The lost-server policy (pure). With `tolerate_lost`, unreachable servers go on the lost list as long as one
    server is left; otherwise they count as failures. Any failure raises one StepError naming every failed server."""
    published = Published(synced=[])
    failures: list[str] = []
    for outcome in outcomes:
        if outcome.sync is not None:
            published.synced.append(outcome.sync)
        elif outcome.unreachable is not None and tolerate_lost:
            published.lost.append(outcome.server)
            logger.warning("%s", outcome.unreachable)
        else:
            failures.append(outcome.failure or outcome.unreachable or f"{outcome.server.label}: no outcome")
    if published.lost and not published.synced and not failures:
        raise ServerUnreachable(f"weight sync to version {version}: every server is unreachable "
                                f"({', '.join(s.label for s in published.lost)})")
    if failures:
        raise StepError(f"weight sync to version {version} failed on {len(failures)} of {len(outcomes)} servers:\n"
                        + "\n".join(f"  - {f}" for f in failures))
    return published
