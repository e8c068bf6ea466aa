"""`actor.weight_update_mode: xccl`: every push goes from trainer rank 0 to every server's workers by broadcast
(rlkit.weights.xccl.XcclSender: one group over every server, NCCL on GPUs, a chain over gloo on the CPU, so rank 0
sends one copy whatever the number of servers), bucket by bucket as the FSDP ranks gather them
(`weight_chunked_mem_mb`), nothing through the filesystem.

Per push, on rank 0: every server is paused -> the group is formed again if the paused servers are not its members
(a server lost, restarted or added: all re-join) -> begin -> the buckets -> finish (sets the version) -> prefix-cache
reset -> resume; the resume also after a failure. A server that fails (the sender names it and the others end the
push without it) is asked whether its process is still there: gone counts as lost (the fan-out goes on with the
others, as in disk mode; its restart joins the next push's group and gets the full version), alive as a failure
naming it. The version and fingerprint checks after the push are the fan-out's (rlkit.weights.fanout), as for every
transport. With `actor.weight_update_delta` (gloo only: vLLM's NCCL engine takes whole tensors) the buckets go out in
the delta wire format (rlkit.weights.delta), a delta whenever every server of the push holds the last push.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rlkit.errors import StepError
from rlkit.servers.backend import Server, ServerBackend, backend_for
from rlkit.servers.http import ServerUnreachable, timed
from rlkit.weights.base import (
    Buckets,
    PushTargets,
    ServerOutcome,
    ServerSync,
    WeightTransport,
    drain,
    outcome_of,
    resume_after,
)
from rlkit.weights.xccl import PushResult, XcclSender

if TYPE_CHECKING:
    import httpx
    import torch

    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.servers.weight_delta import DeltaHeader
    from rlkit.trials.paths import TrialPaths
    from rlkit.weights.delta import DeltaEncoder

# Every part of a push has its own timeout (actor.weight_update_timeout); this only bounds the whole wait on rank 0
# should a part not honour its own.
_BACKSTOP_S = 24 * 3600.0
_GONE_PROBES = 5  # a failed server is asked this many times, this far apart, whether its process is still there
_GONE_PROBE_INTERVAL_S = 1.0


class XcclTransport(WeightTransport):
    """The broadcast transport; rank 0 keeps its groups from push to push (XcclSender)."""

    name = "xccl"

    def __init__(self, config: ExperimentConfig, paths: TrialPaths) -> None:
        super().__init__(config, paths)
        self.bucket_bytes = self.config.actor.weight_chunked_mem_mb << 20
        self._sender: XcclSender | None = None
        self._encoder: DeltaEncoder | None = None  # rank 0, a run with deltas

    def bucket_dtype(self) -> torch.dtype | None:
        from rlkit.models.dtypes import DTYPES

        return DTYPES[self.config.actor.dtype]

    def start(self) -> None:
        print(f"rlkit train: weights reach the servers by broadcast (xccl over {group_backend()}) in buckets of "
              f"{self.config.actor.weight_chunked_mem_mb} MiB", flush=True)
        if self.config.actor.weight_update_delta and group_backend() != "gloo":
            raise StepError("actor.weight_update_delta with weight_update_mode xccl: on GPUs vLLM's NCCL engine "
                            "receives, and it loads whole tensors only (deltas are applied by rlkit's gloo engine, "
                            "CPU servers)\n  fix: set actor.weight_update_mode: disk for delta pushes on GPUs, or "
                            "actor.weight_update_delta: false")

    def push(self, buckets: Buckets, version: int, targets: PushTargets | None) -> list[ServerOutcome] | None:
        if targets is None:
            started = time.monotonic()
            drain(buckets)  # the other ranks only take part in the gathers
            self.timings = {"gather": time.monotonic() - started}
            return None
        try:
            sender = self._sender_for(targets.servers)
            for member in list(sender.members()):  # lost, or restarted under a new address: the group is re-formed
                if all((s.index, s.address) != (member.index, member.address) for s in targets.servers):
                    sender.forget(member)
            targets.begin_update()
            sent, delta = self._delta_encoded(buckets, targets.servers)

            async def run() -> tuple[list[ServerOutcome], PushResult]:
                async with targets.open_client() as client:
                    return await push_all(client, sender, targets.servers, sent, version, targets.timeout,
                                          delta=delta)

            outcomes, result = targets.run(run(), timeout=_BACKSTOP_S,
                                           what=f"broadcasting weight version {version} to {len(targets.servers)} "
                                                "servers (a backstop of 24 h)")
        except BaseException:
            drain(buckets)  # then fail (the gathered buckets, also where the encoding stopped half way)
            raise
        self.timings = {"gather": result.seconds.get("gather", 0.0)}
        self.sent_bytes = result.trainer_bytes
        if self._encoder is not None:  # a run with deltas
            self._encoder.settle(outcomes)
            print(self._encoder.describe(version, self.sent_bytes), flush=True)
        return outcomes

    def _delta_encoded(self, buckets: Buckets, servers: list[Server]) -> tuple[Buckets, DeltaHeader | None]:
        """The buckets as they go out and the push's delta header: as gathered in a run without deltas."""
        if not self.config.actor.weight_update_delta:
            return buckets, None
        if self._encoder is None:
            from rlkit.weights.delta import DeltaEncoder
            from rlkit.weights.hf_export import tied_weight_aliases

            self._encoder = DeltaEncoder(self.bucket_dtype(), skip=tied_weight_aliases(Path(self.config.actor.path)))
        header = self._encoder.header(servers)
        return self._encoder.encoded(buckets), header

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()

    def _sender_for(self, servers: list[Server]) -> XcclSender:
        if self._sender is None:
            from rlkit.config.allocation import parse_allocation
            from rlkit.slurm.jobenv import advertised_host
            from rlkit.weights.hf_export import tied_weight_aliases

            alloc = parse_allocation(self.config.allocation_mode)
            assert alloc.server is not None
            self._sender = XcclSender(backend_for(servers[0].backend), backend=group_backend(),
                                      host=advertised_host(), timeout_s=self.config.actor.weight_update_timeout,
                                      workers_per_server=alloc.server.tp,
                                      skip=tied_weight_aliases(Path(self.config.actor.path)))
        return self._sender


def group_backend() -> str:
    """The broadcast's torch.distributed backend: NCCL where the trainer has CUDA, gloo on the CPU (as the trainer's
    own process group, rlkit.trainer.dist; the servers pick theirs the same way, VllmBackend.launch)."""
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


async def push_all(client: httpx.AsyncClient, sender: XcclSender, servers: list[Server], buckets: Buckets,
                   version: int, timeout: float, *, delta: DeltaHeader | None = None
                   ) -> tuple[list[ServerOutcome], PushResult]:
    """Pause every server, broadcast `version` to those paused, then reset and resume each; one outcome per server.
    `delta`: the push's header in a run with deltas (`buckets` then in its wire format)."""
    syncs = {s.index: ServerSync(index=s.index, address=s.address, version=version) for s in servers}
    started = time.monotonic()
    paused = await asyncio.gather(*(timed(syncs[s.index].phases, "pause",
                                          backend_for(s.backend).pause(client, s, timeout)) for s in servers),
                                  return_exceptions=True)
    errors: dict[int, BaseException] = {s.index: e for s, e in zip(servers, paused, strict=True)
                                        if isinstance(e, BaseException)}
    going = [s for s in servers if s.index not in errors]
    try:
        result = await sender.push(client, going, buckets, version, delta=delta)
    except Exception as exc:  # the push drained the buckets; every server it had is failed, then settled (resumed)
        result = PushResult(failed={s.index: StepError(f"{s.label}: the weight push failed: {type(exc).__name__}: "
                                                       f"{exc}") for s in going})
    errors.update(result.failed)
    for sync in syncs.values():
        sync.phases.update({f"broadcast_{name}": seconds for name, seconds in result.seconds.items()})

    async def settle(server: Server) -> ServerOutcome:
        backend = backend_for(server.backend)
        sync = syncs[server.index]
        try:
            if server.index in errors:
                failure = await _classify(client, backend, server, errors[server.index], timeout)
                if server.index in result.began and not isinstance(failure, ServerUnreachable):
                    await backend.abort_weight_broadcast(client, server, timeout)  # best effort, never raises
                raise failure
            await timed(sync.phases, "reset_cache", backend.reset_prefix_cache(client, server, timeout))
            await timed(sync.phases, "resume", backend.resume(client, server, timeout))
        except Exception as exc:
            return outcome_of(server, await resume_after(client, backend, server, timeout, exc))
        sync.seconds = time.monotonic() - started
        return ServerOutcome(server, sync=sync)

    return list(await asyncio.gather(*(settle(s) for s in servers))), result


async def _classify(client: httpx.AsyncClient, backend: ServerBackend, server: Server, error: BaseException,
                    timeout: float) -> Exception:
    """A failed server's error as the fan-out's policy needs it: ServerUnreachable when its process is gone (the
    broadcast broke because it died), else the error itself (alive, but it did not take the weights). A dying
    server may still answer for a moment (vLLM's API process outlives its engine briefly): it is asked a few times
    over a few seconds, and one refused connection counts as gone."""
    if isinstance(error, ServerUnreachable):
        return error
    for _ in range(_GONE_PROBES):
        try:
            await backend.read_version(client, server, min(timeout, 30.0))
        except ServerUnreachable as gone:
            return ServerUnreachable(f"{error}\n  (the server is gone: {gone})")
        except StepError:
            pass  # alive but not answering properly (an engine that died answers 500): ask again
        await asyncio.sleep(_GONE_PROBE_INTERVAL_S)
    return error if isinstance(error, Exception) else StepError(f"{server.label}: {error}")


TRANSPORT = XcclTransport
