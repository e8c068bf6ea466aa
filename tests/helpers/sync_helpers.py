"""Test helpers (not a conftest): one server's or several servers' disk push run the way `rlkit.weights.fanout.publish`
runs it on trainer rank 0 (delivery by rlkit.weights.disk, then the version and fingerprint checks, then the
lost-server policy), on a client the test gives (a stand-in app's or a real server's), without the trainer's loop."""

from __future__ import annotations

from pathlib import Path

import httpx

from rlkit.servers.backend import Server, backend_for
from rlkit.weights.base import ServerSync
from rlkit.weights.disk import deliver_all, deliver_one
from rlkit.weights.fanout import Probe, check_all, check_server, settle


async def sync_server(client: httpx.AsyncClient, server: Server, weights_dir: Path, version: int,
                      timeout: float) -> ServerSync:
    """The disk delivery to one server, then the version it reports (StepError unless `version`)."""
    result = await deliver_one(client, server, weights_dir, version, timeout)
    return await check_server(client, server, result, version, timeout, None)


async def sync_all(client: httpx.AsyncClient, servers: list[Server], weights_dir: Path, version: int, *,
                   timeout: float, probe_ids: list[int], trainer_lp: list[float], tolerance: float = 1e-2,
                   unreachable: list[Server] | None = None) -> list[ServerSync]:
    """Every server at once: deliveries, version and fingerprint checks, then the lost-server policy (with an
    `unreachable` list, gone servers are put there instead of failing the push)."""
    outcomes = await deliver_all(client, servers, weights_dir, version, timeout)
    outcomes = await check_all(client, outcomes, version, timeout, Probe(probe_ids, trainer_lp, tolerance))
    published = settle(outcomes, version, tolerate_lost=unreachable is not None)
    if unreachable is not None:
        unreachable.extend(published.lost)
    return published.synced


async def read_weight_version(client: httpx.AsyncClient, server: Server, timeout: float) -> str | None:
    return await backend_for(server.backend).read_version(client, server, timeout)
