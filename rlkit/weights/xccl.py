"""Weight sync by broadcast, trainer side (`actor.weight_update_mode: xccl`): trainer rank 0 sends the full weights,
bucket by bucket, to every server's workers over ONE torch.distributed group holding every server of the push
(NCCL on GPUs, gloo on the CPU) while the servers' receive calls run (the server side:
`ServerBackend.join_weight_group` .. `finish_weight_broadcast`).

Why one group: with a group per server, rank 0 sent every byte once per server (N copies of the model on the
trainer's link: 480 GB per step for a 7B model and 32 servers). In one group rank 0 sends about one copy whatever N:
NCCL pipelines its broadcast along a ring; on gloo, whose broadcast is a binomial tree (ceil(log2(world)) copies
from the root), rlkit's vLLM engine makes the group a chain instead: rank 0 sends to the first server's first worker,
each worker forwards to the next (rlkit.servers.vllm.relay). SGLang keeps its own broadcast (gloo: the tree). Ranks:
trainer 0, then server i's workers at 1 + i * tp (the order of the servers given). `PushResult.trainer_bytes` counts
what rank 0 put on the wire (`WeightLink.copies` per byte).

What the per-server groups gave is kept by re-forming. A collective needs every member, and membership is fixed when
a group forms, so: the group is re-formed (every server re-joins concurrently, under a new name) whenever the
servers of a push differ from its members (one lost, restarted, added). When a shared group breaks (a join, or a
bucket: a server died or stalled), rank 0 aborts its end, so the failure runs down the chain at once instead of at
each rank's timeout, and waits for every server's call (each ends within `timeout_s`), which shows who missed the
bucket; a server whose call has not answered by then (stalled) is named and dropped at once; each other server of
the broken group joins a group of its own and gets the bucket again if it missed it (the engine skips names it
loaded already). A server that fails alone too is named with both errors and dropped from the push; the survivors
finish the push in their own groups (N copies for the rest of that push only) and the next push forms one group
again. A dead server fails fast (its connections reset); a stalled one at the step's deadline (`timeout_s` plus the
margins, as with a group per server); a vLLM server alone resumes the update its failed bucket ended. The fan-out
then treats a named server as before: gone is lost (the run goes on; its restart joins the next push's group and
gets the full version), alive is a failure.

Only rank 0 runs this. The other ranks must still run the bucket iterator (`TrainEngine.iter_full_buckets`) to its
end, because each bucket is all-gathered from every rank's shards; `XcclSender.push` exhausts it even when every
server has failed. Every wait has a deadline: a join, a bucket, a finish that takes longer fails naming the server.
Group names carry this trainer's random run id: a server that outlives a trainer (the in-job retry) still holds the
old trainer's groups by name (SGLang keeps them until destroyed), and a new trainer's names must never match them.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, cast

from rlkit.errors import StepError
from rlkit.servers.backend import Server, TensorMeta, WeightGroup, WeightLink
from rlkit.servers.health import find_free_port
from rlkit.weights.base import drain
from rlkit.weights.xccl_group import HTTP_MARGIN_S, Group, Key, close_when_done, fresh_client, key, wait_for_all

if TYPE_CHECKING:
    import httpx
    import torch

    from rlkit.servers.weight_delta import DeltaHeader

logger = logging.getLogger(__name__)

_END = object()  # the bucket iterator is exhausted


class BroadcastControl(Protocol):
    """What a server backend does in a broadcast (the broadcast methods of `rlkit.servers.backend.ServerBackend`)."""

    def open_weight_link(self, group: WeightGroup) -> WeightLink: ...

    async def join_weight_group(self, client: httpx.AsyncClient, server: Server, group: WeightGroup,
                                timeout: float) -> None: ...

    async def begin_weight_broadcast(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None: ...

    async def receive_weight_bucket(self, client: httpx.AsyncClient, server: Server, group: WeightGroup,
                                    tensors: list[TensorMeta], timeout: float, *, push: str = "",
                                    delta: DeltaHeader | None = None) -> None: ...

    async def finish_weight_broadcast(self, client: httpx.AsyncClient, server: Server, version: int,
                                      timeout: float) -> None: ...


@dataclass
class PushResult:
    """What one push did: the servers that failed (by index, with the error naming them) and where the time went."""

    failed: dict[int, StepError] = field(default_factory=dict)
    # join, begin, buckets (gather + send), finish; and within buckets, summed over buckets (and groups): gather
    # (the all-gather of full tensors), trainer_send (rank 0's send), server_receive (the receive calls)
    seconds: dict[str, float] = field(default_factory=dict)
    buckets: int = 0
    bytes_sent: int = 0  # one copy of the weights sent (what each server receives)
    # what rank 0 put on the wire in the sends that completed: per group and bucket, its size x WeightLink.copies
    trainer_bytes: int = 0
    groups: int = 0  # groups formed in this push (0: the last push's group was kept)
    began: set[int] = field(default_factory=set)  # servers whose weight update was opened (begin succeeded)


class XcclSender:
    """Trainer rank 0's weight group over every server and the steps of a push (the module docstring says why one
    group and what happens when it breaks).

    `workers_per_server` is each server's tensor x pipeline parallel size (its ranks in the group); `host` is the
    address the servers reach this node at (`rlkit.slurm.jobenv.advertised_host()`); `skip` holds state-dict names the
    servers do not load (tied aliases: `rlkit.weights.hf_export.tied_weight_aliases`). How a bucket is laid out on
    the wire is the backend's business (`control.open_weight_link`).
    """

    def __init__(self, control: BroadcastControl, *, backend: str, host: str, timeout_s: float,
                 workers_per_server: int = 1, skip: Collection[str] = (), margin_s: float = HTTP_MARGIN_S) -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"broadcast backend must be gloo or nccl, got {backend!r}")
        self.control = control
        self.backend = backend
        self.host = host
        self.timeout_s = timeout_s
        self.workers_per_server = workers_per_server
        self.skip = frozenset(skip)
        self.margin_s = margin_s  # how long after its own timeout a server's call may still answer (tests shorten it)
        self._groups: list[Group] = []  # one, except for the rest of a push after a shared group broke
        self._result = PushResult()  # the current push's
        self._formed = 0
        self._pushes = 0
        self._push_id = ""  # the current push's name: every bucket carries it (BroadcastControl.receive_weight_bucket)
        self._delta: DeltaHeader | None = None  # the current push's delta header, carried by every bucket too
        self._run = secrets.token_hex(4)  # in every group name: see the module docstring

    # ---- groups ----

    def members(self) -> list[Server]:
        """The servers that have a group now, in rank order."""
        return [server for group in self._groups for server in group.servers]

    def joined(self, server: Server) -> bool:
        return any(key(server) in group.groups for group in self._groups)

    def forget(self, server: Server) -> None:
        """Tear down the group holding the server (it failed, or was restarted): the next push forms a new one,
        with every server of that push."""
        for group in [g for g in self._groups if key(server) in g.groups]:
            self._drop(group)

    def close(self) -> None:
        for group in list(self._groups):
            self._drop(group)

    def _drop(self, group: Group) -> None:
        if group in self._groups:
            self._groups.remove(group)
        group.link.close()

    def _layout(self, servers: list[Server]) -> tuple[WeightGroup, dict[Key, WeightGroup]]:
        """A new group over `servers`: rank 0's view of it and each server's (its own rank_offset)."""
        self._formed += 1
        self._result.groups += 1
        tp = self.workers_per_server
        trainer = WeightGroup(master_address=self.host, master_port=find_free_port("0.0.0.0"), rank_offset=1,
                              world_size=1 + len(servers) * tp,
                              group_name=f"rlkit-weights-{self._run}-g{self._formed}", backend=self.backend,
                              timeout_s=self.timeout_s)
        return trainer, {key(s): replace(trainer, rank_offset=1 + i * tp) for i, s in enumerate(servers)}

    async def connect(self, client: httpx.AsyncClient, servers: Iterable[Server]) -> dict[int, StepError]:
        """One group over exactly `servers`: kept if it is that already, else (re-)formed with every one of them;
        the servers that could not join, by index (those that could are in groups of their own until the next
        push: see the module docstring)."""
        servers = list(servers)
        if len(self._groups) == 1 and set(self._groups[0].groups) == {key(s) for s in servers}:
            return {}
        self.close()
        if not servers:
            return {}
        failed, silent = await self._form(client, servers)
        if not failed or len(servers) == 1:
            return failed
        # which server kept the group from forming is not known: each joins alone, but one that did not answer
        # (stalled) is named now, since alone it would stall as long again
        named = {s.index: StepError(f"{failed[s.index]}; dropped from the push without a retry")
                 for s in servers if key(s) in silent}
        async with fresh_client(client) as fresh:
            alone = await asyncio.gather(*(self._form(fresh, [s]) for s in servers if key(s) not in silent))
        named.update({index: StepError(f"{failed[index]}\n  and alone: {error}")
                      for result, _ in alone for index, error in result.items()})
        return named

    async def _form(self, client: httpx.AsyncClient, servers: list[Server]
                    ) -> tuple[dict[int, StepError], set[Key]]:
        """Form a group over `servers`: the failures by server (all of them, if any), and the servers whose call
        did not answer by the deadline."""
        trainer, groups = self._layout(servers)
        where = f"weight group {trainer.group_name} at {trainer.master_address}:{trainer.master_port}"
        local = asyncio.create_task(asyncio.to_thread(self.control.open_weight_link, trainer))
        remote = {key(s): asyncio.create_task(self.control.join_weight_group(
            client, s, groups[key(s)], self.timeout_s + self.margin_s)) for s in servers}
        outcome = await wait_for_all(local, remote, self.timeout_s, on_failure=lambda: close_when_done(local),
                                     margin_s=self.margin_s)
        if outcome.ok:
            self._groups.append(Group(servers=servers, groups=groups, link=local.result(), name=trainer.group_name))
            return {}, set()
        fix = (f"\n  fix: the server's workers must reach {trainer.master_address}:{trainer.master_port} (this trainer "
               f"node; RLKIT_ADVERTISE_HOST overrides the name) and run a {self.backend} weight-transfer engine "
               "(--weight-transfer-config)")
        return {s.index: StepError(f"{s.label}: joining {where} ({len(servers)} servers) failed after "
                                   f"{outcome.seconds:.1f} s ({outcome.reason(key(s))}){fix}") for s in servers
                }, outcome.silent

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
        """Send one bucket (name -> full tensor) through every group of `servers`; the servers that failed."""
        names = [name for name in bucket if name not in self.skip]
        if not names:
            return {}
        wanted = {key(s) for s in servers}
        failed: dict[int, StepError] = {}
        for result in await asyncio.gather(*(self._send(client, group, bucket, names)
                                             for group in list(self._groups) if set(group.groups) <= wanted)):
            failed.update(result)
        return failed

    async def _send(self, client: httpx.AsyncClient, group: Group, bucket: Mapping[str, torch.Tensor],
                    names: list[str]) -> dict[int, StepError]:
        metas = [TensorMeta(name, str(bucket[name].dtype).removeprefix("torch."), tuple(bucket[name].shape))
                 for name in names]
        tensors = [bucket[name] for name in names]
        size = sum(t.nbytes for t in tensors)
        what = f"a bucket of {len(names)} tensors ({size / 1e6:.1f} MB)"
        start = time.perf_counter()
        local = asyncio.create_task(asyncio.to_thread(group.link.send, tensors))
        local.add_done_callback(lambda _: self._add_time("trainer_send", time.perf_counter() - start))
        remote = {key(s): asyncio.create_task(self.control.receive_weight_bucket(
            client, s, group.groups[key(s)], metas, self.timeout_s + self.margin_s, push=self._push_id,
            delta=self._delta)) for s in group.servers}
        outcome = await wait_for_all(local, remote, self.timeout_s, on_failure=group.link.close,
                                     margin_s=self.margin_s)
        self._add_time("server_receive", time.perf_counter() - start)
        if outcome.local_ok:
            self._result.trainer_bytes += size * group.link.copies
        if outcome.ok:
            return {}
        self._drop(group)
        if len(group.servers) == 1:
            server = group.servers[0]
            return {server.index: StepError(
                f"{server.label}: broadcasting {what} failed after {outcome.seconds:.1f} s "
                f"({outcome.reason(key(server))}); its weight group is torn down and the next push forms a new one")}
        # the shared group broke: each of its servers alone, the bucket again to those that missed it
        logger.warning("weight group %s broke on %s (%s); its %d servers go on in groups of their own",
                       group.name, what, "; ".join(f"{s.label}: {outcome.reason(key(s))}" for s in group.servers
                                                   if not outcome.remote_ok(key(s))), len(group.servers))

        async def alone(server: Server, fresh: httpx.AsyncClient) -> dict[int, StepError]:
            shared = (f"{server.label}: broadcasting {what} in {group.name} ({len(group.servers)} servers) failed "
                      f"after {outcome.seconds:.1f} s ({outcome.reason(key(server))})")
            if key(server) in outcome.silent:  # stalled: alone it would stall as long again; named now
                return {server.index: StepError(f"{shared}; dropped from the push without a retry")}
            joined, _ = await self._form(fresh, [server])
            if joined:
                return {server.index: StepError(f"{shared}\n  and alone: {joined[server.index]}")}
            if outcome.remote_ok(key(server)):
                return {}
            try:  # vLLM ends the update when a bucket fails: open it again (the engine keeps what it loaded)
                await self.control.begin_weight_broadcast(fresh, server, self.timeout_s)
            except Exception as exc:  # an engine that kept its update open may refuse: the bucket itself tells
                logger.info("%s: reopening the weight update before the bucket again: %s", server.label, exc)
            own = next(g for g in self._groups if g.servers == [server])
            again = await self._send(fresh, own, bucket, names)
            return {index: StepError(f"{shared}\n  and alone: {error}") for index, error in again.items()}

        failed: dict[int, StepError] = {}
        async with fresh_client(client) as fresh:
            for result in await asyncio.gather(*(alone(server, fresh) for server in group.servers)):
                failed.update(result)
        return failed

    async def push(self, client: httpx.AsyncClient, servers: Iterable[Server],
                   buckets: Iterable[Mapping[str, torch.Tensor] | None], version: int, *,
                   delta: DeltaHeader | None = None) -> PushResult:
        """Join where needed, begin, send every bucket, finish, on every server still going; the servers that failed.

        `buckets` is rank 0's `iter_full_buckets`: it is run to its end whatever fails (the other ranks gather with it).
        The caller pauses the servers before and resets their prefix caches and resumes them after. `delta`: the
        push's header in a run with deltas (its buckets then in the wire format of rlkit.servers.weight_delta).
        """
        result = self._result = PushResult()
        self._delta = delta
        self._pushes += 1
        self._push_id = f"{self._run}-p{self._pushes}"
        live = list(servers)
        iterator = iter(buckets)
        pending: asyncio.Future[object] | None = None
        try:
            start = time.perf_counter()
            live = self._settle(result, live, "join", start, await self.connect(client, live))
            start = time.perf_counter()
            live = self._settle(result, live, "begin", start, await self.begin(client, live))
            result.began = {server.index for server in live}
            if {key(s) for s in self.members()} != {key(s) for s in live}:  # a begin failed: re-form without it
                start = time.perf_counter()
                live = self._settle(result, live, "rejoin", start, await self.connect(client, live))
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
        self._result.seconds[name] = self._result.seconds.get(name, 0.0) + seconds

    def _settle(self, result: PushResult, live: list[Server], phase: str, start: float | None,
                failed: dict[int, StepError]) -> list[Server]:
        """Record a phase's time and failures (their groups torn down); the servers still going."""
        if start is not None:
            result.seconds[phase] = time.perf_counter() - start
        for server in live:
            if server.index in failed:
                result.failed[server.index] = failed[server.index]
                if phase != "begin":  # a failed begin: the group is re-formed without the server right after
                    self.forget(server)
        return [server for server in live if server.index not in failed]

    async def _each(self, servers: Iterable[Server], step: Callable[[Server], Awaitable[None]], what: str
                    ) -> dict[int, StepError]:
        servers = list(servers)

        async def one(server: Server) -> StepError | None:
            try:
                await step(server)
            except Exception as exc:  # StepError naming the route; anything else is a failure of this server too
                return StepError(f"{server.label}: {what} failed: {exc}")
            return None

        results = await asyncio.gather(*(one(server) for server in servers))
        return {s.index: e for s, e in zip(servers, results, strict=True) if e is not None}
