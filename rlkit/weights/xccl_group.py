"""One weight group of a broadcast push (rlkit.weights.xccl) and the wait on one collective step of it: rank 0's
side and every server's call, with a deadline.

Why every call is waited for, not only the first failure: in a shared group, which servers missed a bucket (and get
it again alone) is only known once each server's call has ended; each ends within the group's timeout, since the
engines' own waits have it, and rank 0 aborts its end at the first failure so that the failure reaches every member
at once instead of at its timeout. A call that has not answered by the deadline is cancelled and counts as failed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlkit.servers.backend import Server, WeightGroup, WeightLink

if TYPE_CHECKING:
    import httpx

HTTP_MARGIN_S = 30.0  # a server's receive call answers after its own collective gave up (timeout_s): wait that long
Key = tuple[int, str]  # a server by index and address: a restarted server under a new address is another member


def key(server: Server) -> Key:
    return (server.index, server.address)


@dataclass(eq=False)
class Group:
    """A formed group: its servers in rank order, what each joined with (its rank_offset), rank 0's link."""

    servers: list[Server]
    groups: dict[Key, WeightGroup]
    link: WeightLink
    name: str


@dataclass
class Outcome:
    """How one collective step ended: rank 0's failure, each failed server's, the seconds it took."""

    seconds: float
    local: str | None = None  # rank 0's failure
    remote: dict[Key, str] = field(default_factory=dict)  # failed servers' failures
    silent: set[Key] = field(default_factory=set)  # servers whose call had not answered by the deadline

    @property
    def ok(self) -> bool:
        return self.local is None and not self.remote

    @property
    def local_ok(self) -> bool:
        return self.local is None

    def remote_ok(self, server: Key) -> bool:
        return server not in self.remote

    def reason(self, server: Key) -> str:
        """The failure as seen for `server`: its own call's and rank 0's, whichever failed."""
        parts = [self.remote[server]] if server in self.remote else []
        if self.local is not None:
            parts.append(f"the trainer: {self.local}")
        return "; ".join(parts) or "no failure"


async def wait_for_all(local: asyncio.Task[Any], remote: dict[Key, asyncio.Task[None]], timeout_s: float, *,
                       on_failure: Callable[[], None], margin_s: float = HTTP_MARGIN_S) -> Outcome:
    """Wait for rank 0's task and every server's call until all ended or `timeout_s` + 2 `margin_s` passed; at the first
    failure `on_failure` runs once (it aborts rank 0's end). Calls still running at the deadline are cancelled and
    fail ("no answer"); rank 0's thread, blocked in C, is left to end at its own timeout, also once every server's
    call has ended and one failed (a join whose server is gone: rank 0's rendezvous would wait its whole timeout)."""
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    deadline = loop.time() + timeout_s + 2 * margin_s
    pending: set[asyncio.Task[Any]] = {local, *remote.values()}
    aborted = False
    while pending:
        done, pending = await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()),
                                           return_when=asyncio.FIRST_COMPLETED)
        if not done:
            break
        if not aborted and any(_failure(task) for task in done):
            aborted = True
            on_failure()
        if aborted and pending == {local}:
            break  # every server's call has ended and one failed: rank 0's side cannot succeed; left to end alone
    if pending and not aborted:
        on_failure()
    for task in pending - {local}:
        task.cancel()
    if local in pending:  # not cancelled: a join's close-when-done callback still runs when the thread returns
        local.add_done_callback(lambda task: task.cancelled() or task.exception())  # retrieved: nothing logged
    waited = time.perf_counter() - started
    outcome = Outcome(seconds=waited)
    if local in pending:
        outcome.local = f"not done after {waited:.1f} s (left to end at its own timeout)"
    elif (error := _failure(local)) is not None:
        outcome.local = error
    for server, task in remote.items():
        if task in pending:
            outcome.remote[server] = f"the server: no answer after {waited:.0f} s"
            outcome.silent.add(server)
        elif (error := _failure(task)) is not None:
            outcome.remote[server] = f"the server: {error}"
    return outcome


def _failure(task: asyncio.Task[Any]) -> str | None:
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return None if exc is None else f"{type(exc).__name__}: {exc}"


def close_when_done(trainer: asyncio.Task[WeightLink]) -> None:
    """A join failed: close rank 0's end once its rendezvous returns (or times out)."""
    def close(task: asyncio.Task[WeightLink]) -> None:
        if not task.cancelled() and task.exception() is None:
            task.result().close()

    if trainer.done():
        close(trainer)
    else:
        trainer.add_done_callback(close)


def fresh_client(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """A client like `client` (its headers: the trial's token) on new connections, for the calls that follow a
    broken group: a server that answered the failure with an error closes the connection it answered on, and a
    request sent on that connection at once fails as if the server were gone."""
    import httpx

    from rlkit.servers.tls import shared_tls

    return httpx.AsyncClient(headers=client.headers, trust_env=False, verify=shared_tls())
