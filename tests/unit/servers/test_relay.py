"""The chain relay of a weight push (rlkit.servers.vllm.relay) over real gloo groups, every rank a thread of this
process: the buffers arrive intact at every rank through the chain, and a rank that never answers makes rank 0's send
fail within the group's timeout, the abort run and the peer's failure named, instead of hanging."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from rlkit.servers.deadline import DeadlineExceeded
from rlkit.servers.health import find_free_port
from rlkit.servers.vllm.relay import ChainReceiver, send_chain
from rlkit.servers.vllm.wire import RELAY_PIECE_BYTES, relay_pieces

_STORES: list[dist.Store] = []  # kept referenced while their groups live


def group(port: int, rank: int, world: int, timeout_s: float) -> dist.ProcessGroupGloo:
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    pg = dist.ProcessGroupGloo(dist.PrefixStore("relay-test", store), rank, world, timeout)
    _STORES.append(store)
    return pg


def test_pieces_cover_every_byte_once() -> None:
    assert relay_pieces(0) == []
    assert relay_pieces(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert sum(end - start for start, end in relay_pieces(3 * RELAY_PIECE_BYTES + 1)) == 3 * RELAY_PIECE_BYTES + 1


def test_a_chain_of_three_relays_delivers_every_buffer_to_every_rank() -> None:
    world, port = 4, find_free_port()
    torch.manual_seed(0)
    sent = [torch.randn(3 * RELAY_PIECE_BYTES // 4 + 5), torch.zeros(0), torch.randn(7, 3).to(torch.bfloat16)]
    got: dict[int, list[torch.Tensor]] = {}
    orders: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def relay(rank: int) -> None:
        try:
            pg = group(port, rank, world, 20.0)
            buffers = [torch.empty_like(t) for t in sent]
            orders[rank] = [k for batch in ChainReceiver(pg, rank, world, timedelta(seconds=20), "g").receive(buffers)
                            for k in batch]
            got[rank] = buffers
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=relay, args=(rank,), daemon=True) for rank in range(1, world)]
    for thread in threads:
        thread.start()
    pg0 = group(port, 0, world, 20.0)
    send_chain(pg0, sent, 20.0, "g", on_expiry=lambda: None)
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    for rank in range(1, world):
        assert sorted(orders[rank]) == [0, 1, 2]
        assert all(torch.equal(a, b) for a, b in zip(got[rank], sent, strict=True)), f"rank {rank}"


def test_a_relay_that_never_answers_fails_the_push_within_its_timeout_naming_it() -> None:
    """Rank 1 joins and never posts its receives: rank 0's send fails at its deadline (the abort runs); rank 2,
    waiting behind it, fails at its own deadline naming rank 1, the peer it waited for."""
    world, port = 3, find_free_port()
    payload = [torch.randn(RELAY_PIECE_BYTES // 2)]
    release = threading.Event()
    downstream: list[BaseException] = []

    def silent() -> None:
        pg = group(port, 1, world, 30.0)
        release.wait(30)
        del pg

    def last() -> None:
        pg = group(port, 2, world, 30.0)
        try:
            for _ in ChainReceiver(pg, 2, world, timedelta(seconds=1.0), "g").receive([torch.empty_like(payload[0])]):
                pass
        except RuntimeError as exc:
            downstream.append(exc)

    threads = [threading.Thread(target=silent, daemon=True), threading.Thread(target=last, daemon=True)]
    for thread in threads:
        thread.start()
    pg0 = group(port, 0, world, 30.0)
    aborted: list[int] = []
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"a send of weights to rank 1: not done after 1 s"):
        send_chain(pg0, payload, 1.0, "weights to rank 1", on_expiry=lambda: aborted.append(1))
    assert time.monotonic() - started < 5 and aborted == [1]
    threads[1].join(10)
    assert downstream and "from rank 1" in str(downstream[0]), downstream
    release.set()
