"""XcclSender's bookkeeping that needs no server: the bucket iterator always runs to its end (the other trainer
ranks all-gather with rank 0 until it does), and the wire mode defaults per backend."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from rlkit.servers.vllm.wire import default_packed
from rlkit.weights.xccl import XcclSender


class NoServerControl:
    """Never called: these pushes have no server."""

    async def join_weight_group(self, *args: Any) -> None:
        raise AssertionError("no server to join")

    async def begin_weight_broadcast(self, *args: Any) -> None:
        raise AssertionError("no server to begin")

    async def receive_weight_bucket(self, *args: Any) -> None:
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
    from rlkit.servers.backend import Server

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
