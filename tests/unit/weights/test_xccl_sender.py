"""XcclSender without a real server: the bucket iterator always runs to its end (the other trainer ranks all-gather
with rank 0 until it does), the wire mode defaults per backend, one group over every server (re-formed when they
change), and over real gloo groups with stand-in servers in threads (rlkit's relay, as the vLLM engine runs it): every
server gets every byte while rank 0 sends one copy, and a server that never answers is named and dropped within its
timeout while the others end the push with the bucket it broke."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import torch
import torch.distributed as dist

from rlkit.servers.backend import Server, WeightGroup
from rlkit.servers.vllm.relay import ChainReceiver
from rlkit.servers.vllm.wire import default_packed
from rlkit.weights.xccl import PushResult, XcclSender


class NoServerControl:
    """Never called: these pushes have no server."""

    async def join_weight_group(self, *args: Any) -> None:
        raise AssertionError("no server to join")

    async def begin_weight_broadcast(self, *args: Any) -> None:
        raise AssertionError("no server to begin")

    async def receive_weight_bucket(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("no server to receive")

    async def finish_weight_broadcast(self, *args: Any) -> None:
        raise AssertionError("no server to finish")


def test_a_push_with_no_server_left_still_runs_the_bucket_iterator_to_its_end() -> None:
    seen: list[int] = []

    def buckets() -> Iterator[dict[str, Any] | None]:
        for i in range(3):
            seen.append(i)
            yield {}
        seen.append(-1)  # the end: reached only if the push drained the generator

    sender = XcclSender(NoServerControl(), backend="gloo", host="127.0.0.1", timeout_s=1.0)
    result = asyncio.run(sender.push(None, [], buckets(), 1))  # type: ignore[arg-type]
    assert seen == [0, 1, 2, -1]
    assert result.buckets == 3 and not result.failed


def test_wire_mode_defaults_and_backend_names() -> None:
    assert default_packed("nccl") is True and default_packed("gloo") is False
    with pytest.raises(ValueError, match="gloo or nccl"):
        XcclSender(NoServerControl(), backend="mpi", host="h", timeout_s=1.0)


class BrokenBegin(NoServerControl):
    """Joins (a link that sends nothing), then fails to begin with an error that is not a StepError."""

    def open_weight_link(self, group: Any) -> Any:
        class Link:
            copies = 1

            def send(self, tensors: Any) -> None:
                raise AssertionError("nothing is sent after a failed begin")

            def close(self) -> None:
                pass

        return Link()

    async def join_weight_group(self, *args: Any) -> None:
        await asyncio.sleep(0)

    async def begin_weight_broadcast(self, *args: Any) -> None:
        raise RuntimeError("engine exploded")


def test_a_begin_that_raises_fails_that_server_and_the_iterator_still_runs_to_its_end() -> None:
    seen: list[int] = []

    def buckets() -> Iterator[dict[str, Any] | None]:
        for i in range(2):
            seen.append(i)
            yield {}
        seen.append(-1)

    server = Server(index=3, address="127.0.0.1:9", model="m", backend="vllm")
    sender = XcclSender(BrokenBegin(), backend="gloo", host="127.0.0.1", timeout_s=5.0)
    result = asyncio.run(sender.push(None, [server], buckets(), 1))  # type: ignore[arg-type]
    assert seen == [0, 1, -1], "the other ranks would wait in their all-gathers forever"
    assert list(result.failed) == [3] and "server 3 (127.0.0.1:9)" in str(result.failed[3])
    assert "engine exploded" in str(result.failed[3]) and not sender.joined(server) and not result.began


# ---- one group over every server, over real gloo (stand-in servers: threads running the engine's relay) ----


class ThreadServers(NoServerControl):
    """Servers whose single worker is a thread of this process: the join builds its end of the gloo group at the
    server's rank offset, a receive runs rlkit's relay (rlkit.servers.vllm.relay, as the vLLM gloo engine does).
    A server in `silent` joins, then never answers a receive (its call hangs until cancelled); one in `never_join`
    answers its join without joining."""

    def __init__(self, silent: Collection[int] = (), never_join: Collection[int] = ()) -> None:
        self.silent, self.never_join = set(silent), set(never_join)
        self.ends: dict[int, tuple[Any, Any, WeightGroup]] = {}  # server index -> (store, group, its WeightGroup)
        self.joins: list[tuple[int, WeightGroup]] = []
        self.received: dict[int, list[torch.Tensor]] = {}
        self.hang = asyncio.Event()  # never set

    def open_weight_link(self, group: WeightGroup) -> Any:
        from rlkit.servers.vllm.trainer_link import VllmWeightLink

        return VllmWeightLink(group)

    async def join_weight_group(self, client: Any, server: Server, group: WeightGroup, timeout: float) -> None:
        def join() -> None:
            wait = timedelta(seconds=group.timeout_s)
            store = dist.TCPStore(group.master_address, group.master_port, group.world_size, is_master=False,
                                  timeout=wait)
            pg = dist.ProcessGroupGloo(dist.PrefixStore(group.group_name, store), group.rank_offset,
                                       group.world_size, wait)
            old = self.ends.get(server.index)
            self.ends[server.index] = (store, pg, group)
            if old is not None:
                old[1].abort()  # a re-join replaces the old group, as the engine does

        self.joins.append((server.index, group))
        if server.index in self.never_join:  # answers as if joined, and never does
            return
        await asyncio.to_thread(join)

    async def begin_weight_broadcast(self, *args: Any) -> None:
        pass

    async def finish_weight_broadcast(self, *args: Any) -> None:
        pass

    async def receive_weight_bucket(self, client: Any, server: Server, group: WeightGroup, tensors: list[Any],
                                    timeout: float, *, push: str = "", delta: Any = None) -> None:
        if server.index in self.silent:
            await self.hang.wait()
        _, pg, joined = self.ends[server.index]
        assert joined == group, "a receive on another group than the server joined"
        buffers = [torch.empty(meta.shape, dtype=getattr(torch, meta.dtype)) for meta in tensors]

        def receive() -> None:
            relay = ChainReceiver(pg, group.rank_offset, group.world_size, timedelta(seconds=group.timeout_s),
                                  group.group_name)
            try:
                for _ in relay.receive(buffers):
                    pass
            except BaseException:
                pg.abort()  # as the engine: the ranks after this one fail at once
                raise

        await asyncio.to_thread(receive)
        self.received[server.index] = buffers

    def close(self) -> None:
        for _, pg, _ in self.ends.values():
            with contextlib.suppress(RuntimeError):  # already broken
                pg.abort()


async def push(sender: XcclSender, servers: list[Server], buckets: Iterator[dict[str, torch.Tensor] | None],
               version: int) -> Any:
    async with httpx.AsyncClient() as client:  # never used by the stand-ins; the sender copies its headers
        return await sender.push(client, servers, buckets, version)


def servers(n: int) -> list[Server]:
    return [Server(index=i, address=f"127.0.0.1:{9000 + i}", model="m", backend="vllm") for i in range(n)]


def buckets_of(tensors: dict[str, torch.Tensor]) -> Iterator[dict[str, torch.Tensor] | None]:
    yield {name: tensors[name] for name in list(tensors)[:2]}
    yield {name: tensors[name] for name in list(tensors)[2:]}


def model() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"a": torch.randn(300_000), "b": torch.randn(5, 7).to(torch.bfloat16), "c": torch.randn(1000, 3000)}


def test_one_group_over_every_server_sends_one_copy_and_is_kept_until_the_servers_change() -> None:
    control = ThreadServers()
    sender = XcclSender(control, backend="gloo", host="127.0.0.1", timeout_s=20.0)
    weights = model()
    try:
        first = asyncio.run(sender.push(None, servers(3), buckets_of(weights), 1))  # type: ignore[arg-type]
        assert not first.failed and first.groups == 1 and first.buckets == 2
        assert first.trainer_bytes == first.bytes_sent == sum(t.nbytes for t in weights.values())  # one copy
        assert {group.group_name for _, group in control.joins} == {sender._groups[0].name}
        assert sorted((i, g.rank_offset, g.world_size) for i, g in control.joins) == [(0, 1, 4), (1, 2, 4), (2, 3, 4)]
        assert set(control.received) == {0, 1, 2}  # each server's last bucket arrived intact through the chain
        assert all(torch.equal(control.received[i][0], weights["c"]) and len(control.received[i]) == 1
                   for i in range(3))
        second = asyncio.run(sender.push(None, servers(3), buckets_of(weights), 2))  # type: ignore[arg-type]
        assert not second.failed and second.groups == 0 and len(control.joins) == 3  # the group is kept
        fewer = asyncio.run(sender.push(None, servers(2), buckets_of(weights), 3))  # type: ignore[arg-type]
        assert not fewer.failed and fewer.groups == 1  # re-formed: every remaining server joined again
        assert sorted((i, g.world_size) for i, g in control.joins[3:]) == [(0, 3), (1, 3)]
    finally:
        sender.close()
        control.close()


def test_a_server_that_never_answers_is_named_within_its_timeout_and_the_others_get_the_bucket() -> None:
    """Server 0 (rank 1, the chain's first hop) joins and never receives: rank 0's send fails at its deadline, the
    group is aborted and the server behind it fails at once; server 0's call never answers, so it is named and
    dropped at the step's deadline (no lone retry: it would stall as long again), and server 1 gets the bucket it
    missed alone, then the next one."""
    control = ThreadServers(silent={0})
    timeout, margin = 1.0, 0.5
    result, elapsed, weights = _timed_push(control, 2, timeout, margin)
    assert list(result.failed) == [0], result.failed
    message = str(result.failed[0])
    assert "server 0 (127.0.0.1:9000)" in message and "broadcasting a bucket" in message, message
    assert "no answer" in message and "not done after 1 s" in message and "without a retry" in message, message
    assert elapsed < timeout + 2 * margin + 5, f"took {elapsed:.1f} s"  # one step's deadline, then server 1 alone
    assert [torch.equal(a, weights["c"]) for a in control.received[1]] == [True]  # the last bucket, intact
    assert result.buckets == 2 and result.began == {0, 1}


def _timed_push(control: ThreadServers, count: int, timeout: float, margin: float
                ) -> tuple[PushResult, float, dict[str, torch.Tensor]]:
    """One push of `model()` to `count` stand-in servers; its result, its seconds and the weights pushed."""
    sender = XcclSender(control, backend="gloo", host="127.0.0.1", timeout_s=timeout, margin_s=margin)
    weights = model()
    try:
        started = time.monotonic()
        result = asyncio.run(push(sender, servers(count), buckets_of(weights), 1))
        return result, time.monotonic() - started, weights
    finally:
        sender.close()
        control.close()


def test_a_server_that_never_joins_the_shared_group_is_named_and_the_others_join_alone() -> None:
    """The shared group cannot form (rank 0's rendezvous and the joined servers' wait for the missing rank, each for
    the timeout), and nothing says which server is missing: each server then joins alone, the one that never joins
    fails there too and is named, the others get the whole push alone."""
    control = ThreadServers(never_join={1})
    timeout = 1.0
    result, elapsed, weights = _timed_push(control, 3, timeout, 0.5)
    assert list(result.failed) == [1], result.failed
    message = str(result.failed[1])
    assert "server 1 (127.0.0.1:9001): joining weight group" in message and "(3 servers)" in message, message
    assert "and alone:" in message and "(1 servers)" in message, message
    assert elapsed < 2 * (timeout + 2 * 0.5) + 5, f"took {elapsed:.1f} s"  # the shared join, then the lone ones
    assert result.groups == 4 and result.trainer_bytes == 2 * result.bytes_sent  # two servers alone: two copies
    assert all(torch.equal(control.received[i][0], weights["c"]) for i in (0, 2))
