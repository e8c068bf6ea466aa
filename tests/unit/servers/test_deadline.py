"""Deadlines on the weight link's waits (rlkit.servers.deadline), shared by gloo and NCCL: the polling and the
abort with a fake clock, then over real gloo work handles (two ranks of one group in threads of this process), where
a peer that never posts its broadcast makes rank 0's push fail within the timeout, named, instead of hanging."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from rlkit.servers.deadline import DeadlineExceeded, call_with_deadline, wait_until


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_wait_that_never_ends_is_aborted_and_named_at_its_deadline() -> None:
    clock, aborted = FakeClock(), []
    with pytest.raises(DeadlineExceeded, match=r"a broadcast of group g: not done after 2 s"):
        wait_until(lambda: False, 2.0, "a broadcast of group g", on_expiry=lambda: aborted.append(1),
                   clock=clock, sleep=clock.sleep)
    assert aborted == [1] and 2.0 <= clock.now < 2.0 + 1e-9  # the last sleep ends exactly at the deadline
    assert max(clock.sleeps) <= 0.01  # polled at least every 10 ms: no long sleep past a completion


def test_a_wait_returns_once_done_and_a_failing_abort_does_not_hide_the_deadline() -> None:
    clock, polls = FakeClock(), iter([False, False, True])
    assert wait_until(lambda: next(polls), 5.0, "x", clock=clock, sleep=clock.sleep) == pytest.approx(0.0003)

    def broken() -> None:
        raise RuntimeError("communicator already gone")

    with pytest.raises(DeadlineExceeded):
        wait_until(lambda: False, 0.01, "y", on_expiry=broken, clock=clock, sleep=clock.sleep)


def test_a_call_blocked_in_c_gives_up_at_its_deadline() -> None:
    assert call_with_deadline(lambda: 42, 1.0, "quick") == 42
    with pytest.raises(ValueError, match="boom"):
        call_with_deadline(lambda: (_ for _ in ()).throw(ValueError("boom")), 1.0, "failing")
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="joining the group at h:1"):
        call_with_deadline(lambda: release.wait(30), 0.3, "joining the group at h:1")
    assert time.monotonic() - started < 5
    release.set()


@pytest.mark.parametrize("peer_posts", [True, False])
def test_a_gloo_push_to_a_peer_that_never_answers_fails_within_its_timeout(peer_posts: bool) -> None:
    import torch
    import torch.distributed as dist

    from rlkit.servers.backend import WeightGroup
    from rlkit.servers.health import find_free_port
    from rlkit.servers.vllm.trainer_link import VllmWeightLink

    group = WeightGroup(master_address="127.0.0.1", master_port=find_free_port(), rank_offset=1, world_size=2,
                        group_name="server-0", backend="gloo", timeout_s=1.0)
    received = torch.zeros(4)
    peer_received = threading.Event()
    peer_done = threading.Event()

    def peer() -> None:  # a server's worker: joins, then posts its end of the broadcast, or never does
        store = dist.TCPStore(group.master_address, group.master_port, 2, is_master=False,
                              timeout=timedelta(seconds=30))
        pg = dist.ProcessGroupGloo(dist.PrefixStore(group.group_name, store), 1, 2, timedelta(seconds=30))
        if peer_posts:
            pg.broadcast(received, 0).wait()  # type: ignore[attr-defined]
            peer_received.set()
        peer_done.wait(30)

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    link = VllmWeightLink(group, packed=False, relay=False)  # gloo's broadcast: handles polled as NCCL's events
    started = time.monotonic()
    try:
        if peer_posts:
            link.send([torch.arange(4.0)])
            # the root's send completes once its bytes are out; the peer's copy lands a moment later
            assert peer_received.wait(30)
            assert torch.equal(received, torch.arange(4.0))
        else:
            with pytest.raises(DeadlineExceeded, match=r"a broadcast of weight group server-0: not done after 1 s"):
                link.send([torch.arange(4.0)])
            assert time.monotonic() - started < 10
    finally:
        link.close()
        peer_done.set()
        thread.join(timeout=30)
