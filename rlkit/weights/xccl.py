"""Weight sync by broadcast, trainer side (`actor.weight_update_mode: xccl`): trainer rank 0 sends the full weights,
bucket by bucket, to every server's workers over a torch.distributed group (NCCL on GPUs, gloo on the CPU) while the
servers' receive calls run (the server side: `ServerBackend.join_weight_group` .. `finish_weight_broadcast`).

One group per server, not one group with every server in it: a collective needs every member, so in a shared group
one server that dies or stalls breaks or blocks the broadcast for all the others, and a restarted server cannot enter
a group that exists (membership is fixed when a group forms): every server would have to re-join for each restart.
With a group per server, a lost server fails only its own group, which is torn down; the next push forms a fresh one
for its replacement and sends it everything. The cost: rank 0 sends the bytes once per server (N times the model on
the trainer's link, where one group could use a tree or ring), and one TCPStore and port per server.

Only rank 0 runs this. The other ranks must still run the bucket iterator (`TrainEngine.iter_full_buckets`) to its
end, because each bucket is all-gathered from every rank's shards; `XcclSender.push` exhausts it even when every
server has failed. Every wait has a timeout: a join, a bucket, a finish that takes longer fails naming the server.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from rlkit.errors import StepError
from rlkit.servers.backend import Server, TensorMeta, WeightGroup, WeightLink
from rlkit.servers.health import find_free_port
from rlkit.weights.base import drain

if TYPE_CHECKING:
    import httpx
    import torch

logger = logging.getLogger(__name__)

_END = object()  # the bucket iterator is exhausted
HTTP_MARGIN_S = 30.0  # a server's receive call answers after its own collective gave up (timeout_s): wait that long


class BroadcastControl(Protocol):
    """What a server backend does in a broadcast (the broadcast methods of `rlkit.servers.backend.ServerBackend`)."""

    def open_weight_link(self, group: WeightGroup) -> WeightLink: ...

    async def join_weight_group(self, client: httpx.AsyncClient, server: Server, group: WeightGroup,
                                timeout: float) -> None: ...

    async def begin_weight_broadcast(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None: ...

    async def receive_weight_bucket(self, client: httpx.AsyncClient, server: Server, group: WeightGroup,
                                    tensors: list[TensorMeta], timeout: float) -> None: ...

    async def finish_weight_broadcast(self, client: httpx.AsyncClient, server: Server, version: int,
                                      timeout: float) -> None: ...


@dataclass
class _Member:
    server: Server
    group: WeightGroup
    link: WeightLink


@dataclass
class PushResult:
    """What one push did: the servers that failed (by index, with the error naming them) and where the time went."""

    failed: dict[int, StepError] = field(default_factory=dict)
    # join, begin, buckets (gather + send), finish; and within buckets, summed over buckets (and servers): gather
    # (the all-gather of full tensors), trainer_send (rank 0's broadcast), server_receive (the receive call)
    seconds: dict[str, float] = field(default_factory=dict)
    buckets: int = 0
    bytes_sent: int = 0  # per server
    began: set[int] = field(default_factory=set)  # servers whose weight update was opened (begin succeeded)


class XcclSender:
    """Trainer rank 0's broadcast groups, one per server, and the steps of a push.

    `workers_per_server` is each server's tensor x pipeline parallel size (its ranks in the group); `host` is the
    address the servers reach this node at (`rlkit.slurm.jobenv.advertised_host()`); `skip` holds state-dict names the
    servers do not load (tied aliases: `rlkit.weights.hf_export.tied_weight_aliases`). How a bucket is laid out on
    the wire is the backend's business (`control.open_weight_link`).
    """

    def __init__(self, control: BroadcastControl, *, backend: str, host: str, timeout_s: float,
                 workers_per_server: int = 1, skip: Collection[str] = ()) -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"broadcast backend must be gloo or nccl, got {backend!r}")
        self.control = control
        self.backend = backend
        self.host = host
        self.timeout_s = timeout_s
        self.workers_per_server = workers_per_server
        self.skip = frozenset(skip)
        self._members: dict[tuple[int, str], _Member] = {}
        self._times: dict[str, float] = {}  # the current push's PushResult.seconds
        self._formed = 0
        # a server that outlives a trainer (the in-job retry) still holds the old trainer's groups by name (SGLang
        # keeps them until destroyed): a new trainer's names must never match them
        self._run = secrets.token_hex(4)

    # ---- groups ----

    def members(self) -> list[Server]:
        """The servers that have a group now."""
        return [member.server for member in self._members.values()]

    def joined(self, server: Server) -> bool:
        return (server.index, server.address) in self._members

    def forget(self, server: Server) -> None:
        """Tear down the server's group (it failed, or was restarted): its next push forms a new one."""
        member = self._members.pop((server.index, server.address), None)
        if member is not None:
            member.link.close()

    def close(self) -> None:
        for member in list(self._members.values()):
            self.forget(member.server)

    def _new_group(self, server: Server) -> WeightGroup:
        self._formed += 1
        return WeightGroup(master_address=self.host, master_port=find_free_port("0.0.0.0"), rank_offset=1,
                           world_size=1 + self.workers_per_server,
                           group_name=f"rlkit-weights-{self._run}-s{server.index}-g{self._formed}",
                           backend=self.backend,
                           timeout_s=self.timeout_s)

    async def connect(self, client: httpx.AsyncClient, servers: Iterable[Server]) -> dict[int, StepError]:
        """Form the group of every server that has none, concurrently; the failures, by server index."""
        missing = [server for server in servers if not self.joined(server)]
        joined = await asyncio.gather(*(self._join(client, server) for server in missing), return_exceptions=True)
        results: list[StepError | None] = []
        for server, outcome in zip(missing, joined, strict=True):
            if isinstance(outcome, StepError) or outcome is None:
                results.append(outcome)
            elif isinstance(outcome, Exception):  # e.g. no free port: this server's join failed, not the push
                results.append(StepError(f"{server.label}: joining a weight group failed: "
                                         f"{type(outcome).__name__}: {outcome}"))
            else:
                raise outcome  # KeyboardInterrupt, CancelledError
        return {server.index: error for server, error in zip(missing, results, strict=True) if error is not None}

    async def _join(self, client: httpx.AsyncClient, server: Server) -> StepError | None:
        group = self._new_group(server)
        trainer = asyncio.create_task(asyncio.to_thread(self.control.open_weight_link, group))
        remote = asyncio.create_task(self.control.join_weight_group(client, server, group,
                                                                    self.timeout_s + HTTP_MARGIN_S))
        error = await _both(trainer, remote, f"{server.label}: joining weight group {group.group_name} at "
                            f"{group.master_address}:{group.master_port}", self.timeout_s,
                            on_failure=lambda: _close_when_done(trainer))
        if error is None:
            self._members[(server.index, server.address)] = _Member(server, group, trainer.result())
            return None
        return StepError(f"{error}\n  fix: the server's workers must reach {group.master_address}:{group.master_port} "
                         f"(this trainer node; RLKIT_ADVERTISE_HOST overrides the name) and run a {self.backend} "
                         "weight-transfer engine (--weight-transfer-config)")

    # ---- a push ----

    async def begin(self, client: httpx.AsyncClient, servers: Iterable[Server]) -> dict[int, StepError]:
        return await self._each(servers, lambda s: self.control.begin_weight_broadcast(client, s, self.timeout_s),
                                "starting the weight update")

    async def finish(self, client: httpx.AsyncClient, servers: Iterable[Server], version: int
                     ) -> dict[int, StepError]:
        return await self._each(servers, lambda s: self.control.finish_weight_broadcast(client, s, version,
                                                                                        self.timeout_s),
                                f"finishing weight version {version}")

    async def send_bucket(self, client: httpx.AsyncClient, servers: Iterable[Server],
                          bucket: Mapping[str, torch.Tensor]) -> dict[int, StepError]:
        """Broadcast one bucket (name -> full tensor) to the servers, each receiving concurrently; the failures."""
        names = [name for name in bucket if name not in self.skip]
        if not names:
            return {}
        metas = [TensorMeta(name, str(bucket[name].dtype).removeprefix("torch."), tuple(bucket[name].shape))
                 for name in names]
        tensors = [bucket[name] for name in names]
        members = [self._members[(s.index, s.address)] for s in servers]
        size = sum(t.nbytes for t in tensors)
        what = f"a bucket of {len(names)} tensors ({size / 1e6:.1f} MB)"

        async def one(member: _Member) -> StepError | None:
            sender = asyncio.create_task(asyncio.to_thread(member.link.send, tensors))
            receiver = asyncio.create_task(self.control.receive_weight_bucket(
                client, member.server, member.group, metas, self.timeout_s + HTTP_MARGIN_S))
            start = time.perf_counter()
            sender.add_done_callback(lambda _: self._add_time("trainer_send", time.perf_counter() - start))
            receiver.add_done_callback(lambda _: self._add_time("server_receive", time.perf_counter() - start))
            return await _both(sender, receiver, f"{member.server.label}: broadcasting {what}", self.timeout_s,
                               on_failure=lambda: self.forget(member.server))

        results = await asyncio.gather(*(one(member) for member in members))
        return {m.server.index: e for m, e in zip(members, results, strict=True) if e is not None}

    async def push(self, client: httpx.AsyncClient, servers: Iterable[Server],
                   buckets: Iterable[Mapping[str, torch.Tensor] | None], version: int) -> PushResult:
        """Join where needed, begin, send every bucket, finish, on every server still going; the servers that failed.

        `buckets` is rank 0's `iter_full_buckets`: it is run to its end whatever fails (the other ranks gather with it).
        The caller pauses the servers before and resets their prefix caches and resumes them after.
        """
        result = PushResult()
        self._times = result.seconds
        live = list(servers)
        iterator = iter(buckets)
        pending: asyncio.Future[object] | None = None
        try:
            start = time.perf_counter()
            live = self._settle(result, live, "join", start, await self.connect(client, live))
            start = time.perf_counter()
            live = self._settle(result, live, "begin", start, await self.begin(client, live))
            result.began = {server.index for server in live}
            start = time.perf_counter()
            while True:
                # the next bucket's all-gather runs in a worker thread: this event loop keeps serving other calls
                gather_started = time.perf_counter()
                pending = asyncio.ensure_future(asyncio.to_thread(next, iterator, _END))
                got = await pending
                pending = None
                self._add_time("gather", time.perf_counter() - gather_started)
                if got is _END:
                    break
                bucket = cast("Mapping[str, torch.Tensor] | None", got)
                if bucket is None:
                    continue
                result.buckets += 1
                result.bytes_sent += sum(t.nbytes for name, t in bucket.items() if name not in self.skip)
                if live:
                    live = self._settle(result, live, "buckets", None, await self.send_bucket(client, live, bucket))
        finally:
            # Whatever failed (a join, a begin, a cancellation): the other trainer ranks are in the gathers behind
            # the iterator and wait for rank 0 to run it to its end. Never next() it while a gather still runs.
            if pending is not None:
                await asyncio.wait({pending})
            await asyncio.to_thread(drain, iterator)
        result.seconds["buckets"] = time.perf_counter() - start
        start = time.perf_counter()
        self._settle(result, live, "finish", start, await self.finish(client, live, version))
        return result

    def _add_time(self, name: str, seconds: float) -> None:
        self._times[name] = self._times.get(name, 0.0) + seconds

    def _settle(self, result: PushResult, live: list[Server], phase: str, start: float | None,
                failed: dict[int, StepError]) -> list[Server]:
        """Record a phase's time and failures; the servers still going."""
        if start is not None:
            result.seconds[phase] = time.perf_counter() - start
        for server in live:
            if server.index in failed:
                result.failed[server.index] = failed[server.index]
                self.forget(server)
        return [server for server in live if server.index not in failed]

    async def _each(self, servers: Iterable[Server], step: Callable[[Server], Awaitable[None]], what: str
                    ) -> dict[int, StepError]:
        servers = list(servers)

        async def one(server: Server) -> StepError | None:
            try:
                await step(server)
            except Exception as exc:  # StepError naming the route; anything else is a failure of this server too
                self.forget(server)
                return StepError(f"{server.label}: {what} failed; its weight group is torn down: {exc}")
            return None

        results = await asyncio.gather(*(one(server) for server in servers))
        return {s.index: e for s, e in zip(servers, results, strict=True) if e is not None}


async def _both(local: asyncio.Task[Any], remote: asyncio.Task[None], what: str, timeout_s: float, *,
                on_failure: Callable[[], None]) -> StepError | None:
    """Wait for the trainer's side and the server's side of one collective step; the first failure wins.

    On failure the group is torn down (`on_failure`), the server's call is cancelled, and the trainer's thread is
    left to end at its own timeout (a thread blocked in a collective cannot be interrupted)."""
    start = time.perf_counter()
    done, pending = await asyncio.wait({local, remote}, timeout=timeout_s + 2 * HTTP_MARGIN_S,
                                       return_when=asyncio.FIRST_EXCEPTION)
    failed = [task for task in (remote, local) if task in done and task.exception() is not None]
    if not failed and not pending:
        return None
    remote.cancel()
    on_failure()
    if failed:
        failure = failed[0].exception()
        side = "the server" if failed[0] is remote else "the trainer"
        reason = f"{side}: {type(failure).__name__}: {failure}"
    else:
        reason = f"no answer after {time.perf_counter() - start:.0f} s"
    return StepError(f"{what} failed after {time.perf_counter() - start:.1f} s ({reason}); its weight group is torn "
                     "down and the next push forms a new one")


def _close_when_done(trainer: asyncio.Task[WeightLink]) -> None:
    """A join failed on the server's side: close the trainer's half once its rendezvous returns (or times out)."""
    def close(task: asyncio.Task[WeightLink]) -> None:
        if not task.cancelled() and task.exception() is None:
            task.result().close()

    trainer.add_done_callback(close)

