"""The rollout controller's prompt order and its staleness-bounded admission.

The admission tests use STAND-INS for the inference servers and the reward runner: a real NFS name resolve (in
tmp_path) holds one registered, heart-beating `servers/0` entry so `start()` finds a server as in a job, but
`ServerPool.complete` is replaced (monkeypatched on the class) by an async stand-in that returns fake completions
and records the controller's weight version at call time; no HTTP request is ever made. The reward runner is a
tiny object whose `score()` returns RewardOutcome(1.0).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

from rlkit.errors import StepError
from rlkit.nameresolve import NfsNameResolve, server_key
from rlkit.rewards.runner import RewardOutcome
from rlkit.rollout.controller import RolloutController, epoch_order, prompt_stream
from rlkit.rollout.groups import Prompt
from rlkit.servers.backend import Completion, SamplingParams, Server
from rlkit.servers.pool import ServerPool, discover_servers

N_SAMPLES = 3
SERVER_ADDRESS = "127.0.0.1:9"  # never contacted: ServerPool.complete is a stand-in


def prompts(n: int) -> list[Prompt]:
    return [Prompt(i, {"answer": str(i)}, f"prompt {i}", [100 + i, 200 + i]) for i in range(n)]


# --- epoch_order / prompt_stream --------------------------------------------------------------------------------

def test_epoch_order_without_shuffle_is_the_dataset_order() -> None:
    assert epoch_order(5, 0, 1, False) == [0, 1, 2, 3, 4]
    assert epoch_order(5, 3, 7, False) == [0, 1, 2, 3, 4]


def test_epoch_order_shuffled_is_a_deterministic_permutation() -> None:
    first = epoch_order(20, 0, 1, True)
    assert sorted(first) == list(range(20))
    assert first != list(range(20))
    assert epoch_order(20, 0, 1, True) == first  # same seed and epoch: same order
    assert epoch_order(20, 1, 1, True) != first  # a new order each epoch
    assert epoch_order(20, 0, 2, True) != first  # and per seed


def test_prompt_stream_visits_every_prompt_once_per_epoch() -> None:
    ps = prompts(6)
    got = list(islice(prompt_stream(ps, seed=3, shuffle=True), 18))
    assert [epoch for epoch, _ in got] == [0] * 6 + [1] * 6 + [2] * 6
    for e in range(3):
        order = [p.index for _, p in got[6 * e : 6 * (e + 1)]]
        assert order == epoch_order(6, e, 3, True)
        assert sorted(order) == list(range(6))
    again = [(e, p.index) for e, p in islice(prompt_stream(ps, seed=3, shuffle=True), 18)]
    assert again == [(e, p.index) for e, p in got]


def test_prompt_stream_start_skips_across_epochs() -> None:
    ps = prompts(4)
    full = [(e, p.index) for e, p in islice(prompt_stream(ps, seed=5, shuffle=True), 12)]
    for start in (0, 1, 4, 6):
        resumed = [(e, p.index) for e, p in islice(prompt_stream(ps, seed=5, shuffle=True, start=start), 12 - start)]
        assert resumed == full[start:]
    plain = [(e, p.index) for e, p in islice(prompt_stream(ps, seed=5, shuffle=False, start=3), 3)]
    assert plain == [(0, 3), (1, 0), (1, 1)]


# --- stand-ins --------------------------------------------------------------------------------------------------

class StandInReward:
    """Stands in for RewardRunner: every completion scores 1.0."""

    def __init__(self) -> None:
        self.calls = 0
        self.closed = False

    async def score(self, prompt: str, completion: str, row: dict[str, Any]) -> RewardOutcome:
        self.calls += 1
        return RewardOutcome(1.0)

    def close(self) -> None:
        self.closed = True


class StandInServers:
    """Replaces ServerPool.complete; records (controller version at call time, prompt ids) of every call."""

    def __init__(self) -> None:
        self.controller: RolloutController | None = None
        self.calls: list[tuple[int, list[int]]] = []
        self.lock = threading.Lock()
        self.behaviour: Callable[[int], str] = lambda i: "ok"  # per call index: ok, hang or raise

    @property
    def versions(self) -> list[int]:
        with self.lock:
            return [v for v, _ in self.calls]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        stand_in = self

        async def complete(pool: ServerPool, prompt_ids: list[int], params: SamplingParams
                           ) -> tuple[Server, list[Completion]]:
            assert stand_in.controller is not None
            with stand_in.lock:
                index = len(stand_in.calls)
                stand_in.calls.append((stand_in.controller.version, list(prompt_ids)))
            what = stand_in.behaviour(index)
            if what == "hang":
                await asyncio.sleep(3600)
            if what == "raise":
                raise RuntimeError("connection refused by the stand-in")
            if what == "steperror":
                raise StepError("a request failed 1 times (stand-in)")
            return pool.servers[0], [
                Completion(text=f"c{k}", token_ids=[10 + k, 11], logprobs=[-0.1, -0.2],
                           finish_reason="stop" if k == 0 else "length")
                for k in range(params.n)]

        monkeypatch.setattr(ServerPool, "complete", complete)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[NfsNameResolve]:
    """A real NFS name resolve with server 0 registered the way `rlkit serve` does (keepalive, JSON entry)."""
    nr = NfsNameResolve(tmp_path, "exp", "trial", ttl=30.0, heartbeat_interval=1.0)
    entry = {"index": 0, "address": SERVER_ADDRESS, "backend": "vllm", "model": "tiny", "weight_version": 0}
    nr.add(server_key(0), json.dumps(entry), replace=True, keepalive=True)
    assert [s.address for s in discover_servers(nr)] == [SERVER_ADDRESS]
    yield nr
    nr.close()


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> StandInServers:
    stand_in = StandInServers()
    stand_in.install(monkeypatch)
    # the stand-in has no HTTP endpoint: its /health check is a stand-in too (registered means healthy here)
    monkeypatch.setattr("rlkit.servers.pool.probe_health", lambda addresses, timeout: [True] * len(addresses))
    return stand_in


@pytest.fixture
def make(registry: NfsNameResolve, servers: StandInServers) -> Iterator[Callable[..., RolloutController]]:
    made: list[RolloutController] = []
    rewards: list[StandInReward] = []

    def build(*, max_offpolicyness: int, batch_size: int = 2, queue_size: int | None = 100,
              n_prompts: int = 10) -> RolloutController:
        reward = StandInReward()
        rewards.append(reward)
        ctrl = RolloutController(
            name_resolve=registry, expected_servers=1, token="tok", prompts=prompts(n_prompts),
            params=SamplingParams(n=N_SAMPLES, max_new_tokens=8), reward=reward,  # type: ignore[arg-type]
            decode=lambda ids: " ".join(map(str, ids)), batch_size=batch_size, max_offpolicyness=max_offpolicyness,
            max_concurrent=64, queue_size=queue_size, request_timeout=5.0, request_retries=0, setup_timeout=5.0,
            seed=1, shuffle=False)
        servers.controller = ctrl
        made.append(ctrl)
        return ctrl

    yield build
    for ctrl in made:
        ctrl.stop()
    for reward in rewards:
        reward.close()


def wait_for(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.01)


def settle(ctrl: RolloutController) -> None:
    """Let the controller's loop run everything that is ready (and a little more)."""
    ctrl.run(lambda: asyncio.sleep(0.15), timeout=5.0, what="a test's sleep")


def started(servers: StandInServers, ctrl: RolloutController, n: int) -> list[int]:
    """Wait until `n` requests were sent, let the loop settle, and return the versions of all requests sent."""
    wait_for(lambda: len(servers.versions) >= n)
    settle(ctrl)
    return servers.versions


# --- admission --------------------------------------------------------------------------------------------------

def test_on_policy_starts_one_batch_per_weight_version(make: Callable[..., RolloutController],
                                                       servers: StandInServers) -> None:
    ctrl = make(max_offpolicyness=0)
    found = ctrl.start()
    assert [(s.index, s.address) for s in found] == [(0, SERVER_ADDRESS)]
    assert started(servers, ctrl, 2) == [0, 0]

    groups, stats = ctrl.get_batch(5.0)
    assert [g.version for g in groups] == [0, 0]
    assert [g.prompt.index for g in groups] == [0, 1]
    assert stats.dropped_stale == 0 and stats.request_failures == 0
    assert stats.per_server == {0: 2}
    first = groups[0]
    assert len(first.samples) == N_SAMPLES and first.server == 0
    assert [s.reward for s in first.samples] == [1.0] * N_SAMPLES
    assert [s.finished for s in first.samples] == [True, False, False]
    assert {(tuple(s.prompt_ids), s.group, s.version, s.server) for s in first.samples} == {((100, 200), 0, 0, 0)}
    assert first.samples[0].completion_ids == [10, 11] and first.samples[0].behav_logp == [-0.1, -0.2]
    assert started(servers, ctrl, 2) == [0, 0]  # consumed, but no new weights yet: nothing more starts

    ctrl.begin_update()
    ctrl.end_update(1)
    assert started(servers, ctrl, 4) == [0, 0, 1, 1]
    groups, _ = ctrl.get_batch(5.0)
    assert [(g.version, g.prompt.index) for g in groups] == [(1, 2), (1, 3)]


def test_one_version_off_policy_starts_two_batches_ahead(make: Callable[..., RolloutController],
                                                         servers: StandInServers) -> None:
    ctrl = make(max_offpolicyness=1)
    ctrl.start()
    assert started(servers, ctrl, 4) == [0, 0, 0, 0]
    groups, _ = ctrl.get_batch(5.0)
    assert [g.version for g in groups] == [0, 0]
    assert started(servers, ctrl, 4) == [0, 0, 0, 0]  # still version 0: the bound is 2 batches

    ctrl.begin_update()
    ctrl.end_update(1)
    assert started(servers, ctrl, 6) == [0, 0, 0, 0, 1, 1]
    groups, stats = ctrl.get_batch(5.0)
    assert [g.version for g in groups] == [0, 0]  # one version behind: within the bound, kept
    assert stats.dropped_stale == 0


def test_no_admission_while_updating(make: Callable[..., RolloutController], servers: StandInServers) -> None:
    ctrl = make(max_offpolicyness=0)
    ctrl.start()
    started(servers, ctrl, 2)
    ctrl.get_batch(5.0)
    ctrl.begin_update()
    ctrl.version = 1  # even with a higher version, nothing starts until end_update
    ctrl._call_soon(ctrl._admit_more)
    assert started(servers, ctrl, 2) == [0, 0]
    ctrl.end_update(1)
    assert started(servers, ctrl, 4) == [0, 0, 1, 1]


def test_before_admit_runs_once_before_the_new_version_is_admitted(make: Callable[..., RolloutController],
                                                                   servers: StandInServers) -> None:
    """The fault-injection hook (rlkit.jobs.grpo.fault_corrupt) changes a server between a push and its first
    request."""
    ctrl = make(max_offpolicyness=0)
    ctrl.start()
    started(servers, ctrl, 2)
    ctrl.get_batch(5.0)
    seen: list[tuple[int, int]] = []
    ctrl.before_admit = lambda version: seen.append((version, len(servers.versions)))
    ctrl.begin_update()
    ctrl.end_update(1)
    assert seen == [(1, 2)]  # called with the new version while no request of it had been sent
    assert started(servers, ctrl, 4) == [0, 0, 1, 1]
    ctrl.get_batch(5.0)
    ctrl.begin_update()
    ctrl.end_update(2)
    assert seen == [(1, 2)] and ctrl.before_admit is None  # one-shot


def test_stale_groups_dropped_counted_and_replaced(make: Callable[..., RolloutController],
                                                   servers: StandInServers) -> None:
    ctrl = make(max_offpolicyness=0)
    ctrl.start()
    assert started(servers, ctrl, 2) == [0, 0]
    ctrl.begin_update()
    ctrl.end_update(1)  # the version-0 groups were never consumed: now they are one version too old
    assert started(servers, ctrl, 4) == [0, 0, 1, 1]

    groups, stats = ctrl.get_batch(5.0)
    assert [g.version for g in groups] == [1, 1]
    assert stats.dropped_stale == 2
    assert started(servers, ctrl, 6) == [0, 0, 1, 1, 1, 1]  # each dropped group freed its place
    assert started(servers, ctrl, 6) == [0, 0, 1, 1, 1, 1]  # and no more than that

    more, stats2 = ctrl.get_batch(5.0)
    assert [g.version for g in more] == [1, 1]
    assert stats2.dropped_stale == 0  # counters are per batch
    assert sorted(g.prompt.index for g in groups + more) == [2, 3, 4, 5]  # the dropped prompts 0, 1 are gone


def test_get_batch_times_out_naming_what_it_waited_for(make: Callable[..., RolloutController],
                                                       servers: StandInServers) -> None:
    ctrl = make(max_offpolicyness=0)
    ctrl.start()
    ctrl.get_batch(5.0)
    t0 = time.monotonic()
    with pytest.raises(StepError, match=r"waited \d+ s for 2 rollout groups, got 0; are the servers generating"):
        ctrl.get_batch(0.3)  # on-policy and no new weights: nothing can arrive
    assert 0.25 <= time.monotonic() - t0 < 3.0


def test_get_batch_timeout_counts_what_did_arrive(make: Callable[..., RolloutController],
                                                  servers: StandInServers) -> None:
    servers.behaviour = lambda i: "ok" if i == 0 else "hang"
    ctrl = make(max_offpolicyness=0)
    ctrl.start()
    with pytest.raises(StepError, match="for 2 rollout groups, got 1"):
        ctrl.get_batch(0.3)


@pytest.mark.parametrize(("what", "message"), [("raise", r"a rollout failed: RuntimeError\('connection refused"),
                                               ("steperror", r"^a request failed 1 times \(stand-in\)$")])
def test_failing_request_makes_get_batch_raise(make: Callable[..., RolloutController], servers: StandInServers,
                                               what: str, message: str) -> None:
    servers.behaviour = lambda i: what
    ctrl = make(max_offpolicyness=0)
    ctrl.start()
    with pytest.raises(StepError, match=message):
        ctrl.get_batch(5.0)
    wait_for(lambda: ctrl.stats.request_failures == 2)


def test_start_without_servers_raises(tmp_path: Path, servers: StandInServers) -> None:
    empty = NfsNameResolve(tmp_path, "exp", "other", ttl=30.0, heartbeat_interval=1.0)
    ctrl = RolloutController(
        name_resolve=empty, expected_servers=1, token="tok", prompts=prompts(2), params=SamplingParams(),
        reward=StandInReward(), decode=str, batch_size=1, max_offpolicyness=0,  # type: ignore[arg-type]
        max_concurrent=4, queue_size=None, request_timeout=1.0, request_retries=0, setup_timeout=0.1, seed=1,
        shuffle=False)
    try:
        with pytest.raises(StepError, match="waited 0 s for 1 inference servers to register"):
            ctrl.start()
        assert servers.calls == []
    finally:
        ctrl.stop()
        empty.close()


def test_empty_training_set_is_refused(registry: NfsNameResolve) -> None:
    with pytest.raises(StepError, match="the training set is empty"):
        RolloutController(name_resolve=registry, expected_servers=1, token="t", prompts=[],
                          params=SamplingParams(), reward=StandInReward(), decode=str,  # type: ignore[arg-type]
                          batch_size=1, max_offpolicyness=0, max_concurrent=1, queue_size=None,
                          request_timeout=1.0, request_retries=0, setup_timeout=0.1, seed=1, shuffle=False)


# --- submit: server requests while the trainer's thread blocks (a weight broadcast) ------------------------------

def test_submit_runs_on_the_loop_while_the_caller_blocks(make: Callable[..., RolloutController]) -> None:
    ctrl = make(max_offpolicyness=0)
    unstarted = asyncio.sleep(0)
    with pytest.raises(StepError, match="not running"):
        ctrl.submit(unstarted)
    ctrl.start()
    released = threading.Event()

    async def wait_for_the_trainer() -> str:
        await asyncio.to_thread(released.wait, 5.0)  # e.g. a bucket receive that ends when the broadcast does
        return threading.current_thread().name

    future = ctrl.submit(wait_for_the_trainer())
    time.sleep(0.05)
    assert not future.done()  # returned at once; the coroutine is still running on the loop
    released.set()  # the trainer's blocking call ends
    assert future.result(timeout=5.0) == "rollout"


def test_requests_follow_each_servers_adapter_also_across_liveness_rounds(
        make: Callable[..., RolloutController], servers: StandInServers, monkeypatch: pytest.MonkeyPatch) -> None:
    """LoRA (rlkit.weights.lora_disk): after a push the pool's servers name the new adapter; the liveness watcher,
    which re-reads servers from name resolve (where no adapter is recorded), must not drop it."""
    monkeypatch.setattr("rlkit.rollout.controller.LIVENESS_POLL_S", 0.05)
    ctrl = make(max_offpolicyness=0)
    [found] = ctrl.start()
    assert found.adapter is None
    started(servers, ctrl, 2)
    ctrl.get_batch(5.0)
    ctrl.begin_update()
    ctrl.mark_synced([Server(index=0, address=SERVER_ADDRESS, model="tiny", backend="vllm", adapter="exp-v1")])
    ctrl.end_update(1)
    started(servers, ctrl, 4)
    assert ctrl.pool is not None and [s.adapter for s in ctrl.pool.servers] == ["exp-v1"]
    pool, reread = ctrl.pool, ctrl.pool.set_servers
    rounds: list[list[str | None]] = []

    def counted(live: list[Server]) -> None:  # each call: one watcher round that re-read the servers
        reread(live)
        rounds.append([s.adapter for s in pool.servers])

    monkeypatch.setattr(pool, "set_servers", counted)
    wait_for(lambda: len(rounds) >= 3)  # several watcher rounds replaced the pool's servers
    settle(ctrl)
    assert rounds[:3] == [["exp-v1"]] * 3 and [s.adapter for s in ctrl.pool.servers] == ["exp-v1"]


def test_a_server_that_stops_answering_health_is_left_out_of_the_push_under_way(
        make: Callable[..., RolloutController], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The watcher asks the server GET /health (the stand-in's address answers nothing, as a stopped server): past
    the silence timeout the server's part of the push under way is cancelled and reported unreachable (the fan-out
    goes on without it), a push begun while it is silent leaves it out at once, and pushes skip it."""
    from rlkit.servers.http import ServerUnreachable

    monkeypatch.setattr("rlkit.rollout.controller.LIVENESS_POLL_S", 0.05)
    ctrl = make(max_offpolicyness=0)
    ctrl.silence.timeout = 0.3
    server = ctrl.start()[0]
    started = time.monotonic()
    push = ctrl.submit(ctrl.guard_push(server, asyncio.sleep(3600)))  # e.g. a reload the server never answers
    with pytest.raises(ServerUnreachable, match=r"has not answered /health for 0.3 s .*left out of this push"):
        push.result(timeout=10)
    assert time.monotonic() - started < 10 and ctrl.silence.silent == {0}
    with pytest.raises(ServerUnreachable):
        ctrl.submit(ctrl.guard_push(server, asyncio.sleep(3600))).result(timeout=5)
    assert ctrl.live_servers() == []  # registered, heart-beating, but silent: no push goes to it
    assert f"server 0 ({SERVER_ADDRESS}) has not answered /health for 0.3 s" in capsys.readouterr().out


def test_run_past_its_timeout_fails_naming_what_it_waited_for(make: Callable[..., RolloutController]) -> None:
    ctrl = make(max_offpolicyness=0)
    ctrl.start()
    with pytest.raises(StepError, match=r"^resuming the 2 servers: not done after 0\.1 s$"):
        ctrl.run(lambda: asyncio.sleep(5), timeout=0.1, what="resuming the 2 servers")
