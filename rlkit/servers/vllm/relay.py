"""A weight push as a chain over one gloo group, so trainer rank 0 sends the model once whatever the number of servers.

gloo's broadcast is a binomial tree: its root sends ceil(log2(world)) copies (3 at a world of 5, measured with
`ss -ti` on loopback), so one shared gloo group alone does not keep the trainer's bytes flat. In the chain, rank 0
sends each buffer to rank 1 only, in pieces (`wire.relay_pieces`); every rank r receives its pieces from r - 1 and
forwards each one to r + 1 as soon as it has arrived (point-to-point send/recv on the same group, tagged by the
piece's position in the call), so the pieces flow down the chain pipelined and the last rank only receives. Rank 0's
bytes are one copy; the push takes one transfer plus a few pieces' delay per hop.

Both ends cut the same pieces from the same buffers (the tensors of one `/update_weights` call, in order) and number
them from 0 in every call. Every wait has the group's deadline: a rank that never answers fails the wait, named by
the caller. Pure torch (no vLLM): the trainer (rlkit.servers.vllm.trainer_link) and rlkit's gloo engine in the
workers (rlkit.servers.vllm.gloo_engine) both use it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from rlkit.servers.deadline import DeadlineExceeded
from rlkit.servers.vllm.wire import relay_pieces

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

logger = logging.getLogger(__name__)
_DONE = object()


def pieces(buffers: list[torch.Tensor]) -> list[tuple[int, torch.Tensor]]:
    """(buffer index, contiguous byte view) of every piece of `buffers`, in send order (each buffer contiguous)."""
    import torch

    out: list[tuple[int, torch.Tensor]] = []
    for k, buffer in enumerate(buffers):
        flat = buffer.view(-1).view(torch.uint8)
        out.extend((k, flat[start:end]) for start, end in relay_pieces(flat.numel()))
    return out


def send_chain(pg: Any, buffers: list[torch.Tensor], timeout_s: float, what: str, *,
               on_expiry: Callable[[], None]) -> None:
    """Rank 0: send every piece of `buffers` to rank 1, all posted at once, each waited for against the deadline (on
    expiry `on_expiry` aborts the group). `pg` is a ProcessGroupGloo (its send and recv have no type stubs)."""
    handles = [pg.send([piece], 1, tag) for tag, (_, piece) in enumerate(pieces(buffers))]
    for handle in handles:
        wait_work(handle, timeout_s, f"a send of {what}", on_expiry=on_expiry)


def wait_work(work: dist.Work, timeout_s: float, what: str, *, on_expiry: Callable[[], None]) -> None:
    """Wait for a gloo send or receive within `timeout_s`. Such a handle completes only inside its own `wait` (its
    `is_completed` stays False until then: no polling as in rlkit.servers.deadline), and gloo bounds that wait
    itself; on a timeout the group is aborted (`on_expiry`) and DeadlineExceeded names `what`."""
    try:
        work.wait(timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        if "Timed out" not in str(exc):
            raise  # a broken connection: the peer is gone
        try:
            on_expiry()
        except Exception as abort_error:  # a broken group may fail its abort; the deadline error counts
            logger.warning("aborting after %s timed out failed: %s", what, abort_error)
        raise DeadlineExceeded(f"{what}: not done after {timeout_s:g} s (the communicator was aborted)") from exc


class ChainReceiver:
    """Rank r >= 1 of a chain: receive from r - 1, forward to r + 1 unless last (`world_size`), in a thread of its
    own, so forwarding goes on while the caller loads what has arrived."""

    def __init__(self, pg: Any, rank: int, world_size: int, timeout: timedelta, what: str) -> None:
        if not 1 <= rank < world_size:
            raise ValueError(f"a relay rank must be in 1..{world_size - 1}, got {rank}")
        self.pg, self.rank, self.timeout, self.what = pg, rank, timeout, what
        self.next = rank + 1 if rank + 1 < world_size else None

    def receive(self, buffers: list[torch.Tensor]) -> Iterator[list[int]]:
        """Fill `buffers` (contiguous) in order; yields the indices of the buffers that have arrived, in order, in
        batches (all that arrived while the caller was busy), and returns once every piece is also forwarded.
        Raises RuntimeError naming the peer when a receive or a forward fails or outlives the deadline."""
        cut = pieces(buffers)
        last = {k: tag for tag, (k, _) in enumerate(cut)}  # a buffer has arrived with its last piece
        arrived: queue.Queue[Any] = queue.Queue()
        for k in range(len(buffers)):
            if k not in last:  # empty: nothing travels
                arrived.put(k)
        receives = [self.pg.recv([piece], self.rank - 1, tag) for tag, (_, piece) in enumerate(cut)]

        def forward() -> None:
            try:
                sends = []
                for tag, (k, piece) in enumerate(cut):
                    self._wait(receives[tag], f"receiving piece {tag} of {len(cut)} from rank {self.rank - 1}")
                    if self.next is not None:
                        sends.append(self.pg.send([piece], self.next, tag))
                    if last[k] == tag:
                        arrived.put(k)
                for tag, send in enumerate(sends):
                    self._wait(send, f"forwarding piece {tag} of {len(cut)} to rank {self.next}")
                arrived.put(_DONE)
            except BaseException as exc:  # handed to the caller's thread
                arrived.put(exc)

        threading.Thread(target=forward, name=f"relay {self.what}", daemon=True).start()
        backstop = 2 * self.timeout.total_seconds() + 5  # the forwarder's own waits end first
        while True:
            try:
                batch = [arrived.get(timeout=backstop)]
            except queue.Empty:
                raise RuntimeError(f"{self.what}: rank {self.rank} relay got nothing for {backstop:g} s") from None
            while not arrived.empty():
                batch.append(arrived.get_nowait())
            for item in batch:
                if isinstance(item, BaseException):
                    raise RuntimeError(f"{self.what}: rank {self.rank}: {item}") from item
            indices = [item for item in batch if item is not _DONE]
            if indices:
                yield indices
            if _DONE in batch:
                return

    def _wait(self, work: dist.Work, what: str) -> None:
        try:
            done = work.wait(self.timeout)
        except RuntimeError as exc:  # gloo raises on a broken connection and (some versions) on the timeout
            raise RuntimeError(f"{what} failed: {exc}") from exc
        if done is False:
            raise RuntimeError(f"{what}: not done after {self.timeout.total_seconds():g} s")
