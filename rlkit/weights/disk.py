"""Weight sync through a shared filesystem: trainer rank 0 writes the version as a Hugging Face directory
(rlkit.weights.hf_export) and every inference server reloads it in place (`ServerBackend.load_weights_from_disk`),
between a pause and a resume (rlkit.weights.base.deliver_in_sequence). With `actor.weight_update_delta` a push to
servers that hold the last one is one file of the changed elements instead (rlkit.weights.delta), which each server
applies to the copy it keeps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.servers.backend import Server, backend_for
from rlkit.weights.base import (
    Buckets,
    PushTargets,
    ServerOutcome,
    ServerSync,
    WeightTransport,
    deliver_in_sequence,
    die_mid_push_first,
    die_now,
    outcome_of,
)

if TYPE_CHECKING:
    import httpx
    from torch import Tensor

    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.servers.weight_delta import DeltaHeader
    from rlkit.trials.paths import TrialPaths
    from rlkit.weights.delta import DeltaEncoder


class DiskTransport(WeightTransport):
    """`actor.weight_update_mode: disk`. Versions live in `<trial>/weights/version-<N>`; only the newest is kept."""

    name = "disk"

    def __init__(self, config: ExperimentConfig, paths: TrialPaths) -> None:
        super().__init__(config, paths)
        self._encoder: DeltaEncoder | None = None  # rank 0, a run with deltas: made at its first push

    def start(self) -> None:
        from rlkit.weights import hf_export

        hf_export.remove_old_versions(self.paths.weights, keep=set())  # a version directory is never rewritten

    def push(self, buckets: Buckets, version: int, targets: PushTargets | None) -> list[ServerOutcome] | None:
        from rlkit.weights import hf_export

        started = time.monotonic()
        state: dict[str, Tensor] = {}
        for bucket in buckets:  # every rank to the end: the gathers behind the iterator are collective
            if bucket is not None:
                state.update({name: tensor.cpu() for name, tensor in bucket.items()})
        self.timings = {"gather": time.monotonic() - started}
        if targets is None:
            return None
        targets.begin_update()
        out_dir = hf_export.version_dir(self.paths.weights, version)
        started = time.monotonic()
        delta = self._write(state, out_dir, targets.servers)
        self.timings["write"] = time.monotonic() - started
        self.sent_bytes = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())  # one copy, read by all
        del state

        async def deliver() -> list[ServerOutcome]:
            async with targets.open_client() as client:
                if die_mid_push_first(targets.servers, version):  # tests: one server updated, then the trainer dies
                    await deliver_one(client, targets.servers[0], out_dir, version, targets.timeout, delta=delta)
                    die_now()
                return await deliver_all(client, targets.servers, out_dir, version, targets.timeout, delta=delta,
                                         guard=targets.guard)

        outcomes = targets.run(deliver(), timeout=2 * targets.timeout + 60,
                               what=f"loading weight version {version} from disk on {len(targets.servers)} servers "
                                    "(limit: 2 x actor.weight_update_timeout + 60 s)")
        if self._encoder is not None:  # a run with deltas
            self._encoder.settle(outcomes)
            print(self._encoder.describe(version, self.sent_bytes), flush=True)
        hf_export.remove_old_versions(self.paths.weights, keep={version})
        return outcomes

    def _write(self, state: dict[str, Tensor], out_dir: Path, servers: Sequence[Server]) -> DeltaHeader | None:
        """Write the version: a checkpoint, or (a run with deltas, every server holding the last push) the delta
        file; the push's delta header (None: a run without deltas)."""
        from rlkit.models.dtypes import DTYPES
        from rlkit.weights import hf_export
        from rlkit.weights.delta import DeltaEncoder, write_delta

        model_dir, dtype = Path(self.config.actor.path), DTYPES[self.config.actor.dtype]
        if not self.config.actor.weight_update_delta:
            hf_export.write_weights(state, model_dir, out_dir, dtype=dtype)
            return None
        if self._encoder is None:
            self._encoder = DeltaEncoder(dtype)
        header = self._encoder.header(servers)
        encoded = self._encoder.encode_bucket(hf_export.resolve_ties(state, hf_export.tied_weight_aliases(model_dir)))
        self._encoder.complete()
        if header.base is None:
            hf_export.write_weights(encoded, model_dir, out_dir, dtype=dtype)
        else:
            write_delta(encoded, out_dir, header)
        return header


async def deliver_one(client: httpx.AsyncClient, server: Server, weights_dir: Path, version: int,
                      timeout: float, *, delta: DeltaHeader | None = None) -> ServerSync:
    """Make `server` load the weights in `weights_dir` as `version`: pause -> load (and set the version) -> reset
    the prefix cache -> resume. The version it reports is checked by the fan-out (rlkit.weights.fanout). `delta`:
    the push's header in a run with deltas."""
    weights_dir = Path(weights_dir).absolute()  # the server resolves relative paths against its own cwd
    backend = backend_for(server.backend)
    result = ServerSync(index=server.index, address=server.address, version=version)
    started = time.monotonic()

    async def load() -> None:
        load_started = time.monotonic()
        report = await backend.load_weights_from_disk(client, server, weights_dir, version, timeout, delta=delta)
        seconds = report.get("seconds")
        if isinstance(seconds, dict):
            result.phases.update({str(k): float(v) for k, v in seconds.items()})
        else:
            result.phases["reload"] = time.monotonic() - load_started
        workers = report.get("workers")
        result.workers = workers if isinstance(workers, list) else []

    await deliver_in_sequence(client, backend, server, timeout, result.phases, load)
    result.seconds = time.monotonic() - started
    return result


async def deliver_all(client: httpx.AsyncClient, servers: Sequence[Server], weights_dir: Path, version: int,
                      timeout: float, *, delta: DeltaHeader | None = None,
                      guard: Callable[[Server, Awaitable[Any]], Awaitable[Any]] = lambda server, call: call
                      ) -> list[ServerOutcome]:
    """`deliver_one` on every server at once; every server is tried (and resumed) whatever the others do. `guard`:
    PushTargets.guard (a server found silent meanwhile is left out)."""
    results = await asyncio.gather(*(guard(s, deliver_one(client, s, weights_dir, version, timeout, delta=delta))
                                     for s in servers), return_exceptions=True)
    return [outcome_of(server, result) for server, result in zip(servers, results, strict=True)]


TRANSPORT = DiskTransport
