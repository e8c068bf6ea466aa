"""LoRA adapters to the servers through the shared filesystem (`actor.use_lora`): trainer rank 0 writes each version's
adapter as a peft directory (rlkit.weights.adapter_files.write_adapter) and every server loads it under a NEW name
(`adapter_name`), then forgets the older adapters of the run. The base weights on the servers never change.

Why a new name per version instead of reloading one name: vLLM keys its prefix cache by the adapter's name and path,
not its weights, so new weights under an old name could be served from stale KV; and requests already running keep
the adapter they started with, so nothing needs to be paused (their samples carry the version they were admitted
at). The version each server reports and the fingerprint THROUGH the new adapter are checked by the fan-out
(rlkit.weights.fanout) as for full weights: `Server.adapter` is set once a server loaded it, and every request
(probe, rollout) then names it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.servers.backend import Server, backend_for
from rlkit.weights.base import (
    ADAPTER_TRANSPORT,
    Buckets,
    PushTargets,
    ServerOutcome,
    ServerSync,
    WeightTransport,
    die_mid_push_first,
    die_now,
    outcome_of,
)

if TYPE_CHECKING:
    import httpx
    from torch import Tensor

    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.trials.paths import TrialPaths

logger = logging.getLogger(__name__)


def adapter_prefix(config: ExperimentConfig) -> str:
    """What every adapter name of this run starts with (older ones are found and unloaded by it)."""
    return f"{config.experiment_name}-v"


def adapter_name(config: ExperimentConfig, version: int) -> str:
    """The name weight version `version`'s adapter is loaded (and requested) under: `<experiment>-v<N>`."""
    return f"{adapter_prefix(config)}{version}"


class LoraDiskTransport(WeightTransport):
    """Adapters only, by disk. Versions live in `<trial>/weights/version-<N>` (a peft directory); the newest two are
    kept (requests admitted before a push may still run on the previous adapter)."""

    name = ADAPTER_TRANSPORT
    adapters_only = True

    def __init__(self, config: ExperimentConfig, paths: TrialPaths) -> None:
        super().__init__(config, paths)
        # Within one trainer process names never repeat; a restarted trainer may push a version (name AND directory)
        # a server saw before, whose cached KV (keyed by name and path) is of the older adapter: its first push
        # also resets the prefix cache.
        self._first_push = True

    def start(self) -> None:
        from rlkit.weights import hf_export

        hf_export.remove_old_versions(self.paths.weights, keep=set())  # a version directory is never rewritten
        actor = self.config.actor
        print(f"rlkit train: weights reach the servers as LoRA adapters only (rank {actor.lora_rank}, alpha "
              f"{actor.lora_alpha:g}, {', '.join(actor.target_modules)}): {self.paths.weights}/version-<N>, loaded "
              f"as {adapter_prefix(self.config)}<N>", flush=True)

    def push(self, buckets: Buckets, version: int, targets: PushTargets | None) -> list[ServerOutcome] | None:
        from rlkit.weights import hf_export
        from rlkit.weights.adapter_files import is_adapter_param, write_adapter

        started = time.monotonic()
        tensors: dict[str, Tensor] = {}
        for bucket in buckets:  # every rank to the end: the gathers behind the iterator are collective
            if bucket is not None:
                tensors.update(bucket)
        self.timings = {"gather": time.monotonic() - started}
        if targets is None:
            return None
        full = [name for name in tensors if not is_adapter_param(name)]
        if full or not tensors:
            raise ValueError(f"the {self.name} transport takes the LoRA adapter only "
                             f"(rlkit.trainer.lora.iter_adapter_buckets), got {len(full)} other tensors, e.g. "
                             f"{full[:3]}")
        targets.begin_update()
        out_dir = hf_export.version_dir(self.paths.weights, version)
        started = time.monotonic()
        write_adapter(tensors, self.config.actor, self.config.actor.path, out_dir)
        self.timings["write"] = time.monotonic() - started
        self.sent_bytes = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())  # one copy, read by all
        name, prefix = adapter_name(self.config, version), adapter_prefix(self.config)
        reset_cache = self._first_push

        async def deliver() -> list[ServerOutcome]:
            async with targets.open_client() as client:
                if die_mid_push_first(targets.servers, version):  # tests: one server updated, then the trainer dies
                    await deliver_one(client, targets.servers[0], out_dir, name, prefix, version, targets.timeout,
                                      reset_cache=reset_cache)
                    die_now()
                return await deliver_all(client, targets.servers, out_dir, name, prefix, version, targets.timeout,
                                         reset_cache=reset_cache, guard=targets.guard)

        outcomes = targets.run(deliver(), timeout=2 * targets.timeout + 60,
                               what=f"loading adapter version {version} on {len(targets.servers)} servers "
                                    "(limit: 2 x actor.weight_update_timeout + 60 s)")
        self._first_push = False
        hf_export.remove_old_versions(self.paths.weights, keep={version, version - 1})
        return outcomes


async def deliver_one(client: httpx.AsyncClient, server: Server, adapter_dir: Path, name: str, prefix: str,
                      version: int, timeout: float, *, reset_cache: bool = False) -> ServerSync:
    """Load `adapter_dir` on `server` as `name` (reported version `version`), point `server.adapter` at it, then
    unload the server's other adapters named `<prefix>...` (older versions, also a crashed trainer's). With
    `reset_cache`, drop the server's prefix cache after the load (on a backend whose cache keys an adapter by its name:
`ServerBackend.adapter_cache_by_name`). Phases: load_adapter, set_version, [reset_cache],
    unload_old."""
    adapter_dir = Path(adapter_dir).absolute()  # the server resolves relative paths against its own cwd
    backend = backend_for(server.backend)
    result = ServerSync(index=server.index, address=server.address, version=version)
    started = time.monotonic()
    loaded = set(await backend.list_adapters(client, server, timeout))
    if name in loaded:  # a retried push of the same version (a restarted trainer): drop the stale one first
        await backend.unload_adapter(client, server, name, timeout)
    report = await backend.load_adapter(client, server, name, adapter_dir, version, timeout)
    seconds = report.get("seconds")
    if isinstance(seconds, dict):
        result.phases.update({str(k): float(v) for k, v in seconds.items()})
    if reset_cache and backend.adapter_cache_by_name:
        started_reset = time.monotonic()
        await backend.reset_prefix_cache(client, server, timeout)
        result.phases["reset_cache"] = time.monotonic() - started_reset
    server.adapter = name  # from now on the probe and the rollout ask for it
    unload_started = time.monotonic()
    for old in sorted(loaded - {name}):
        if old.startswith(prefix):
            await backend.unload_adapter(client, server, old, timeout)
    result.phases["unload_old"] = time.monotonic() - unload_started
    result.seconds = time.monotonic() - started
    return result


async def deliver_all(client: httpx.AsyncClient, servers: Sequence[Server], adapter_dir: Path, name: str,
                      prefix: str, version: int, timeout: float, *, reset_cache: bool = False,
                      guard: Callable[[Server, Awaitable[Any]], Awaitable[Any]] = lambda server, call: call
                      ) -> list[ServerOutcome]:
    """`deliver_one` on every server at once; every server is tried whatever the others do. `guard`:
    PushTargets.guard (a server found silent meanwhile is left out)."""
    results = await asyncio.gather(*(guard(s, deliver_one(client, s, adapter_dir, name, prefix, version, timeout,
                                                          reset_cache=reset_cache)) for s in servers),
                                   return_exceptions=True)
    return [outcome_of(server, result) for server, result in zip(servers, results, strict=True)]


TRANSPORT = LoraDiskTransport
