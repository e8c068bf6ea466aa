"""The weight-transport interface: how a new version of the trainer's weights reaches the inference servers.

A transport is driven by the trainer loop on EVERY FSDP rank once per version: each rank passes the same bucket
iterator (`TrainEngine.iter_full_buckets`: rank 0 gets buckets of full tensors, the others one None) to `push`, in
lock step, so the gathers inside it are collective. Only rank 0 talks to the servers; it gets `PushTargets` (the
others None), does its HTTP on the rollout controller's event loop (`PushTargets.submit`, so that requests can run
concurrently with blocking collectives on the trainer's thread) and returns one `ServerOutcome` per server instead of
stopping at the first failure. What happens to a lost or failed server, and the version and fingerprint check after
every push, is the fan-out's job (rlkit.weights.fanout), the same for every transport.

Transports register by `actor.weight_update_mode` in `_TRANSPORTS`; this module imports neither torch nor a
transport (the names are actor.weight_update_mode's, rlkit.config.schema.actor.WEIGHT_UPDATE_MODES).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import logging
import os
import signal
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from rlkit.config.schema.actor import WEIGHT_UPDATE_MODES, WeightUpdateMode
from rlkit.errors import StepError
from rlkit.servers.backend import Server, ServerBackend
from rlkit.servers.http import ServerUnreachable, timed
from rlkit.slurm.faults import fault_point

if TYPE_CHECKING:
    import httpx
    import torch
    from torch import Tensor

    from rlkit.config.schema.actor import ActorConfig
    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.trials.paths import TrialPaths

logger = logging.getLogger(__name__)
T = TypeVar("T")

Buckets = Iterator["dict[str, Tensor] | None"]  # TrainEngine.iter_full_buckets


@dataclass
class ServerSync:
    """What syncing one server took: total and per-phase seconds, and the fingerprint difference when probed."""

    index: int
    address: str
    version: int
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    workers: list[dict[str, Any]] = field(default_factory=list)  # what the server reported per worker (vLLM)
    fingerprint: float | None = None  # mean |server - trainer| logprob over the probe tokens


@dataclass
class ServerOutcome:
    """One server after a push: synced (`sync` set), unreachable (its process is gone) or failed (`failure`)."""

    server: Server
    sync: ServerSync | None = None
    unreachable: str | None = None  # why it counts as gone (the fan-out may go on without it)
    failure: str | None = None  # the error, naming the server


@dataclass
class PushTargets:
    """What trainer rank 0 needs to reach the servers during a push (the other ranks get None)."""

    servers: list[Server]
    timeout: float  # seconds each server request may take
    submit: Callable[[Coroutine[Any, Any, Any]], concurrent.futures.Future[Any]]  # run on the controller's loop
    open_client: Callable[[], httpx.AsyncClient]  # a client carrying the trial token (rlkit.servers.http)
    # called once before the first server is touched (after the gather when the transport gathers first): the
    # rollout controller stops admitting groups while the weights change
    begin_update: Callable[[], None] = lambda: None
    # runs one server's part of the push until it ends, or until the server is found silent (the rollout
    # controller's watch): ServerUnreachable then, so the push goes on without it instead of waiting out `timeout`
    guard: Callable[[Server, Awaitable[Any]], Awaitable[Any]] = lambda server, call: call

    def run(self, coro: Coroutine[Any, Any, T], timeout: float, *, what: str) -> T:
        """Run `coro` on the controller's loop and wait at most `timeout` s for it; StepError naming `what` (the
        step and the limit's make-up) after that. A backstop: each server request inside has its own deadline."""
        future = self.submit(coro)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise StepError(f"{what}: not done after {timeout:g} s, though every server request in it has its own "
                            "deadline (actor.weight_update_timeout): the trainer's event loop is blocked or a "
                            "server's answer never completes; the trainer's log names the servers it waited on"
                            ) from None


class WeightTransport(ABC):
    """One way to move the trainer's weights to the servers. Built once per run on every trainer rank."""

    name: ClassVar[str]  # the actor.weight_update_mode value
    # True: `push` takes the LoRA adapter's tensors (rlkit.trainer.lora.iter_adapter_buckets), not the full weights
    adapters_only: ClassVar[bool] = False
    bucket_bytes: int = 256 << 20  # the size of the buckets `push` wants (TrainEngine.iter_full_buckets)

    def __init__(self, config: ExperimentConfig, paths: TrialPaths) -> None:
        self.config = config
        self.paths = paths
        self.timings: dict[str, float] = {}  # trainer-side seconds of the last push by phase ("gather", "write")
        # bytes rank 0 sent toward the servers in the last push: the files written (disk), or what it put on the wire
        # (xccl: one copy of the weights per group on a chain or NCCL, whatever the number of servers)
        self.sent_bytes = 0

    def bucket_dtype(self) -> torch.dtype | None:
        """The dtype the buckets are cast to while gathered (None: the training dtype, as the model holds them)."""
        return None

    def start(self) -> None:  # noqa: B027 - optional hook
        """Trainer rank 0, once before the first push: drop what an earlier attempt of the trial left behind."""

    @abstractmethod
    def push(self, buckets: Buckets, version: int, targets: PushTargets | None) -> list[ServerOutcome] | None:
        """Collective: consume `buckets` to its end on every rank; on rank 0 (`targets` given) deliver the weights to
        every server of `targets` as `version` and return one outcome per server, in their order (None elsewhere).

        Each server must be paused while its weights change, get its prefix cache reset and be resumed, also after a
        failure (`deliver_in_sequence`); the version it reports and its fingerprint are checked by the fan-out."""

    def close(self) -> None:  # noqa: B027 - optional hook: groups, files
        """Release what the transport holds (groups, temporary files) at the end of the run."""


# Keyed by actor.weight_update_mode's values (rlkit.config.schema.actor.WEIGHT_UPDATE_MODES, the one list); each
# module exposes TRANSPORT, a WeightTransport subclass.
_TRANSPORTS: dict[WeightUpdateMode, str] = {"disk": "rlkit.weights.disk", "xccl": "rlkit.weights.xccl_transport"}
TRANSPORT_NAMES: tuple[str, ...] = WEIGHT_UPDATE_MODES
# Chosen by actor.use_lora, not by weight_update_mode (which must then be disk: rlkit.checks.lora).
ADAPTER_TRANSPORT = "lora_disk"
_ADAPTER_MODULE = "rlkit.weights.lora_disk"


def transport_for(name: str) -> type[WeightTransport]:
    """The transport class for `actor.weight_update_mode` `name`; ValueError naming the known ones."""
    if name not in TRANSPORT_NAMES:
        raise ValueError(f"unknown weight_update_mode {name!r}; known: {', '.join(TRANSPORT_NAMES)}")
    return _transport_in(_TRANSPORTS[cast(WeightUpdateMode, name)])


def transport_for_actor(actor: ActorConfig) -> type[WeightTransport]:
    """The transport a run uses: adapters by disk with `actor.use_lora` (rlkit.weights.lora_disk), else the one
    `actor.weight_update_mode` names."""
    if actor.use_lora:
        return _transport_in(_ADAPTER_MODULE)
    return transport_for(actor.weight_update_mode)


def _transport_in(module: str) -> type[WeightTransport]:
    transport = importlib.import_module(module).TRANSPORT
    if not (isinstance(transport, type) and issubclass(transport, WeightTransport)):
        raise TypeError(f"{module}.TRANSPORT is not a WeightTransport subclass")
    return transport


async def deliver_in_sequence(client: httpx.AsyncClient, backend: ServerBackend, server: Server, timeout: float,
                              phases: dict[str, float], deliver: Callable[[], Awaitable[T]]) -> T:
    """pause -> `deliver()` -> reset the prefix cache -> resume, the resume ALWAYS (also when the pause itself failed:
    it may have paused without answering), except for a server whose process is gone. Phases: pause, reset_cache,
    resume (the delivery times its own)."""

    async def resume() -> None:
        await timed(phases, "resume", backend.resume(client, server, timeout))

    try:
        await timed(phases, "pause", backend.pause(client, server, timeout))
        result = await deliver()
        # Old KV must not serve a request again: held requests recompute with the new weights on resume.
        await timed(phases, "reset_cache", backend.reset_prefix_cache(client, server, timeout))
    except BaseException as failure:
        reported = await resume_after(client, backend, server, timeout, failure)
        if reported is failure:
            raise
        raise reported from failure
    await resume()
    return result


async def resume_after(client: httpx.AsyncClient, backend: ServerBackend, server: Server, timeout: float,
                       failure: BaseException) -> BaseException:
    """After `failure` on `server`: resume it, unless its process is gone (a live server must never stay paused,
    even holding part of new weights); returns what to report: `failure`, with the resume's own failure added."""
    if isinstance(failure, ServerUnreachable):
        return failure  # nothing to resume
    if isinstance(failure, asyncio.CancelledError):  # a silent server's part, or the push itself, was cancelled
        with contextlib.suppress(Exception):  # never wait on a frozen server; its next push resumes it anyway
            await asyncio.wait_for(backend.resume(client, server, timeout), CANCELLED_RESUME_S)
        return failure
    try:
        await backend.resume(client, server, timeout)
    except StepError as resume_error:
        if isinstance(failure, StepError):
            return StepError(f"{failure}\n  and the resume after it failed too (the server may stay paused): "
                             f"{resume_error}")
        logger.error("%s (after %s: %s)", resume_error, type(failure).__name__, failure)
    return failure


CANCELLED_RESUME_S = 5.0  # how long a cancelled delivery tries to resume its server before giving up


def drain(buckets: Iterable[object]) -> None:
    """Run a bucket iterator to its end: the other trainer ranks are in the all-gathers behind it until it is."""
    for _ in buckets:
        pass


def outcome_of(server: Server, result: ServerSync | BaseException) -> ServerOutcome:
    """A server's outcome from what its delivery returned or raised (KeyboardInterrupt, CancelledError re-raised)."""
    if isinstance(result, ServerSync):
        return ServerOutcome(server, sync=result)
    if isinstance(result, ServerUnreachable):
        return ServerOutcome(server, unreachable=str(result))
    if isinstance(result, StepError):
        return ServerOutcome(server, failure=str(result))
    if not isinstance(result, Exception):
        raise result
    return ServerOutcome(server, failure=f"{server.label}: {type(result).__name__}: {result}")


def die_mid_push_first(servers: Sequence[Server], version: int) -> bool:
    """Tests (RLKIT_FAULT_INJECT=die_mid_push@V): deliver to the first server only, then the trainer dies."""
    return bool(servers) and fault_point("die_mid_push", version)


def die_now() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
