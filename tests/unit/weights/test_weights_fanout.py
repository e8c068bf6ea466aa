"""The fan-out (lost-server policy, version and fingerprint check after every push), the transport registry and the
disk transport's push, on the trainer-rank-0 path: PushTargets run the server requests on an event loop in another
thread (as the rollout controller's), the servers are stand-in routes (tests/unit/weights/test_weights_disk.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import load_file

from rlkit.config.load import load_config
from rlkit.errors import StepError
from rlkit.models.tiny import build_tiny_model
from rlkit.servers.backend import Server
from rlkit.servers.http import ServerUnreachable
from rlkit.trials.paths import TrialPaths
from rlkit.weights import fanout
from rlkit.weights.base import (
    Buckets,
    PushTargets,
    ServerOutcome,
    ServerSync,
    WeightTransport,
    transport_for,
)
from rlkit.weights.disk import DiskTransport
from rlkit.weights.hf_export import version_dir
from tests.unit.weights.test_weights_disk import PROBE, StandInServer, server

TRAINER_LP = [-0.5 * i for i in range(1, len(PROBE))]  # what every StandInServer answers for PROBE
PROBE_CHECK = fanout.Probe(PROBE, TRAINER_LP, 1e-3)


def synced(s: Server, version: int = 5) -> ServerOutcome:
    return ServerOutcome(s, sync=ServerSync(index=s.index, address=s.address, version=version))


def gone(s: Server) -> ServerOutcome:
    return ServerOutcome(s, unreachable=f"{s.label}: pause failed, the server is unreachable")


def failed(s: Server) -> ServerOutcome:
    return ServerOutcome(s, failure=f"{s.label}: the weight reload answered HTTP 500")


# ---- settle: the policy alone ----------------------------------------------------------------------------------


def test_settle_goes_on_without_lost_servers() -> None:
    one, two = server(index=1), server(index=2)
    published = fanout.settle([synced(one), gone(two)], 5, tolerate_lost=True)
    assert [r.index for r in published.synced] == [1] and published.lost == [two]


def test_settle_every_server_gone_is_unreachable() -> None:
    with pytest.raises(ServerUnreachable, match=r"version 5: every server is unreachable \(server 1 .*, server 2 "):
        fanout.settle([gone(server(index=1)), gone(server(index=2))], 5, tolerate_lost=True)


def test_settle_collects_every_failure_naming_each_server() -> None:
    with pytest.raises(StepError) as info:
        fanout.settle([failed(server(index=1)), gone(server(index=2)), failed(server(index=3)),
                       synced(server(index=4))], 5, tolerate_lost=True)
    message = str(info.value)
    assert "weight sync to version 5 failed on 2 of 4 servers" in message
    assert "server 1 (10.0.0.1:8000)" in message and "server 3 (10.0.0.3:8000)" in message
    assert "server 2" not in message  # gone, not failed
    with pytest.raises(StepError, match=r"failed on 1 of 2 servers:\n  - server 2 .* unreachable"):
        fanout.settle([synced(server(index=1)), gone(server(index=2))], 0, tolerate_lost=False)


# ---- publish and verify on the rank-0 path ---------------------------------------------------------------------


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop in its own thread, as the rollout controller's."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def stand_ins(apps: dict[str, StandInServer]) -> httpx.MockTransport:
    """Stand-in servers by address (host:port); an address without one refuses connections (its process is gone)."""

    async def handler(request: httpx.Request) -> httpx.Response:
        app = apps.get(request.url.netloc.decode())
        if app is None:
            raise httpx.ConnectError("All connection attempts failed", request=request)
        body = json.loads(request.content) if request.content else None
        app.calls.append(request.url.path)
        app.bodies[request.url.path] = body
        status, content = app.answer(request.url.path, request.url.query.decode(), body)
        return httpx.Response(status, json=content)

    return httpx.MockTransport(handler)


def targets_on(loop: asyncio.AbstractEventLoop, servers: list[Server], transport: httpx.MockTransport,
               began: list[int] | None = None) -> PushTargets:
    return PushTargets(servers=servers, timeout=5.0,
                       submit=lambda coro: asyncio.run_coroutine_threadsafe(coro, loop),
                       open_client=lambda: httpx.AsyncClient(transport=transport),
                       begin_update=(lambda: began.append(1)) if began is not None else (lambda: None))


class PresetTransport(WeightTransport):
    """A transport whose deliveries turn out as given (the policy is the fan-out's, whatever the transport did)."""

    name = "preset"

    def __init__(self, outcome: Callable[[Server], ServerOutcome]) -> None:
        self.outcome = outcome
        self.consumed: list[Any] = []

    def push(self, buckets: Buckets, version: int, targets: PushTargets | None) -> list[ServerOutcome] | None:
        self.consumed = list(buckets)
        return None if targets is None else [self.outcome(s) for s in targets.servers]


def test_publish_checks_the_version_and_fingerprint_of_every_delivered_server(
        loop: asyncio.AbstractEventLoop) -> None:
    servers = [server(index=1), server(index=2), server(index=3)]
    apps = {"10.0.0.1:8000": StandInServer(report_version="5"), "10.0.0.3:8000": StandInServer(report_version="4")}
    transport = PresetTransport(lambda s: gone(s) if s.index == 2 else synced(s))
    with pytest.raises(StepError) as info:
        fanout.publish(transport, iter([{"w": torch.zeros(1)}]), 5, targets_on(loop, servers, stand_ins(apps)),
                       PROBE_CHECK)
    assert "failed on 1 of 3 servers" in str(info.value)
    assert "server 3 (10.0.0.3:8000): reports weight version '4' after the sync, not 5" in str(info.value)
    assert apps["10.0.0.1:8000"].calls == ["/weight_info", "/v1/completions"]  # checked although another one failed
    assert apps["10.0.0.3:8000"].calls == ["/weight_info"] and len(transport.consumed) == 1

    published = fanout.publish(transport, iter([]), 5, targets_on(loop, servers[:2], stand_ins(apps)), PROBE_CHECK)
    assert published is not None and published.lost == [servers[1]]
    [result] = published.synced
    assert result.index == 1 and result.fingerprint == 0.0 and set(result.phases) == {"check_version", "probe"}


def test_publish_fails_a_server_that_does_not_serve_the_weights(loop: asyncio.AbstractEventLoop) -> None:
    apps = {"10.0.0.1:8000": StandInServer(report_version="5")}
    wrong = fanout.Probe(PROBE, [lp - 0.5 for lp in TRAINER_LP], 1e-3)
    with pytest.raises(StepError, match=r"server 1 \(10.0.0.1:8000\) does not serve the trainer's weights"):
        fanout.publish(PresetTransport(synced), iter([]), 5, targets_on(loop, [server(index=1)], stand_ins(apps)),
                       wrong)


def test_publish_off_rank_0_only_runs_the_buckets() -> None:
    transport = PresetTransport(synced)
    assert fanout.publish(transport, iter([None]), 5, None, None) is None
    assert transport.consumed == [None]


def test_verify_checks_fingerprints_and_tolerates_no_loss(loop: asyncio.AbstractEventLoop) -> None:
    apps = {"10.0.0.1:8000": StandInServer()}
    published = fanout.verify(targets_on(loop, [server(index=1)], stand_ins(apps)), PROBE_CHECK)
    assert [r.fingerprint for r in published.synced] == [0.0] and apps["10.0.0.1:8000"].calls == ["/v1/completions"]
    with pytest.raises(StepError, match=r"failed on 1 of 2 servers:\n  - server 2 .*unreachable"):
        fanout.verify(targets_on(loop, [server(index=1), server(index=2)], stand_ins(apps)), PROBE_CHECK)


# ---- the registry and the disk transport -------------------------------------------------------------------------


def test_transport_for_names_the_known_modes() -> None:
    assert transport_for("disk") is DiskTransport
    with pytest.raises(ValueError, match="unknown weight_update_mode 'nfs'; known: disk"):
        transport_for("nfs")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_disk_push_writes_the_buckets_and_every_server_loads_them(
        loop: asyncio.AbstractEventLoop, grpo_yaml: Path, tmp_path: Path, tiny: Path) -> None:
    model = tiny
    config = load_config(grpo_yaml, [f"actor.path={model}", "actor.dtype=float32"])
    paths = TrialPaths(tmp_path / "trial")
    state = load_file(str(model / "model.safetensors"))
    names = sorted(state)
    buckets = [{n: state[n] + 1.0 for n in names[:3]}, {n: state[n] + 1.0 for n in names[3:]}]
    stale = version_dir(paths.weights, 2)
    stale.mkdir(parents=True)
    transport = DiskTransport(config, paths)

    assert transport.push(iter([None]), 3, None) is None  # another rank: only the gathers
    assert not version_dir(paths.weights, 3).exists()

    apps = {"10.0.0.1:8000": StandInServer(), "10.0.0.2:8000": StandInServer()}
    began: list[int] = []
    outcomes = transport.push(iter(buckets), 3, targets_on(loop, [server(index=1), server(index=2)],
                                                          stand_ins(apps), began))
    written = version_dir(paths.weights, 3)
    assert outcomes is not None and [o.sync.index for o in outcomes if o.sync] == [1, 2] and began == [1]
    assert set(outcomes[0].sync.phases) == {"pause", "reload", "set_version", "reset_cache", "resume"}
    assert apps["10.0.0.2:8000"].bodies["/collective_rpc"]["kwargs"] == {"weights_path": str(written.absolute())}
    assert apps["10.0.0.1:8000"].calls == ["/pause", "/collective_rpc", "/update_weight_version", "/reset_prefix_cache",
                                      "/resume"]
    on_disk = load_file(str(written / "model.safetensors"))
    assert sorted(on_disk) == names and torch.equal(on_disk[names[-1]], state[names[-1]] + 1.0)
    assert not stale.exists() and set(transport.timings) == {"gather", "write"}
    # what rank 0 sent toward the servers: the files written, once for both servers
    assert transport.sent_bytes == sum(f.stat().st_size for f in written.rglob("*") if f.is_file()) > 0


def test_every_weight_update_mode_resolves_to_its_transport() -> None:
    """actor.weight_update_mode's values (one list, in the config) are what validation offers, and each names a
    transport module of that name."""
    from rlkit.config.schema.actor import WEIGHT_UPDATE_MODES
    from rlkit.jobs.grpo.checks import CHOICES
    from rlkit.weights.base import TRANSPORT_NAMES, transport_for

    assert CHOICES["actor.weight_update_mode"] == TRANSPORT_NAMES == WEIGHT_UPDATE_MODES == ("disk", "xccl")
    assert [transport_for(name).name for name in WEIGHT_UPDATE_MODES] == ["disk", "xccl"]


def test_a_push_past_its_backstop_fails_naming_what_it_waited_for(loop: asyncio.AbstractEventLoop) -> None:
    """The controller's loop blocked (every server request's own deadline then never fires): the backstop names the
    step and its limit, not "an operation on the servers"."""
    targets = targets_on(loop, [], httpx.MockTransport(lambda request: httpx.Response(200)))
    blocked = threading.Event()
    loop.call_soon_threadsafe(blocked.wait, 5.0)
    try:
        with pytest.raises(StepError, match=r"^loading weight version 3 from disk on 2 servers: not done after 0\.1 s"):
            targets.run(asyncio.sleep(0), timeout=0.1, what="loading weight version 3 from disk on 2 servers")
    finally:
        blocked.set()


def test_a_probe_queued_behind_generation_is_waited_for_as_long_as_a_request(
        loop: asyncio.AbstractEventLoop) -> None:
    """The fingerprint probe goes to a resumed server: one at its max_num_seqs queues it behind generation, first come
    first served. Its deadline is the push's timeout plus the queue (rollout.request_timeout), not the push's alone,
    which failed a healthy server (and the step) while it generated."""
    apps = {"10.0.0.1:8000": StandInServer()}
    inner = stand_ins(apps)

    async def busy(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions":
            await asyncio.sleep(0.6)  # behind the generation requests that run to their end first
        return await inner.handle_async_request(request)

    targets = dataclasses.replace(targets_on(loop, [server(index=1)], inner), timeout=0.3,
                                  open_client=lambda: httpx.AsyncClient(transport=httpx.MockTransport(busy)))
    with pytest.raises(StepError, match=r"no complete answer within 0\.3 s to probe logprobs"):
        fanout.verify(targets, PROBE_CHECK)  # without the queue's allowance
    published = fanout.verify(targets, dataclasses.replace(PROBE_CHECK, queue_s=2.0))
    assert [r.fingerprint for r in published.synced] == [0.0]
