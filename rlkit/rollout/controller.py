"""The rollout controller: streams prompt groups to the servers while the trainer trains, with staleness control.

It runs its own asyncio loop in a background thread of trainer rank 0. Each prompt is one request for
`gconfig.n_samples` completions (a GRPO group); each finished completion is scored as it arrives, and a finished
group goes to a queue the trainer reads with `get_batch`.

Staleness. Weight version v means v weight updates have reached the servers. A group is admitted only while
`started_groups < (v + max_head_offpolicyness + 1) * batch_size` (with a push every k steps after an offset o:
`(o + (v + max_head_offpolicyness + 1) * k) * batch_size`, rlkit.rollout.sync_schedule), so a group is at most
max_head_offpolicyness versions older than the weights being trained when it is consumed; 0 gives synchronous
on-policy GRPO (the next batch starts only once the new weights are on the servers). Groups that are older anyway
(e.g. after a resync) are dropped at consumption and counted. While the trainer updates the servers' weights no
group is admitted, so a group's version tag is the version of the weights it was sampled with.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rlkit.agent.episode import Episode
from rlkit.data.files import epoch_order
from rlkit.errors import StepError
from rlkit.nameresolve.base import NameResolve
from rlkit.rewards.mix import RewardScorer
from rlkit.rollout.groups import GroupSampler, Prompt, SampledGroup, SingleTurnGroups
from rlkit.rollout.silence import ServerWatch
from rlkit.rollout.sync_schedule import SyncSchedule
from rlkit.servers.backend import SamplingParams, Server
from rlkit.servers.pool import (
    ServerPool,
    discover_servers,
    wait_for_servers,
    why_servers_vanished,
)
from rlkit.types import Sample

T = TypeVar("T")
LIVENESS_POLL_S = 5.0
RECORD_HEAL_WAIT_S = 30.0  # the default name-resolve ttl: a removed record is back after one heartbeat (5 s)


@dataclass
class Group:
    """The completions of one prompt, scored, tagged with the weight version that produced them."""

    prompt: Prompt
    samples: list[Sample]
    version: int
    server: int
    seconds: float
    seq: int = 0  # position in the prompt stream (what a resumed run skips)
    reward_errors: int = 0
    reward_timeouts: int = 0
    episodes: list[Episode] = field(default_factory=list)  # multi-turn groups: one per sample (agent metrics)


@dataclass
class RolloutStats:
    """Counters since the last batch (reset by get_batch)."""

    dropped_stale: int = 0
    reward_errors: int = 0
    reward_timeouts: int = 0
    request_failures: int = 0
    dropped_episodes: int = 0  # episodes an agent program could not finish (their groups were sampled again)
    wait_s: float = 0.0
    per_server: dict[int, int] = field(default_factory=dict)


def prompt_stream(prompts: list[Prompt], *, seed: int, shuffle: bool, start: int = 0) -> Iterator[tuple[int, Prompt]]:
    """(epoch, prompt) forever, epoch after epoch, skipping the first `start` (resuming)."""
    k = 0
    epoch = 0
    while True:
        for i in epoch_order(len(prompts), epoch, seed, shuffle):
            if k >= start:
                yield epoch, prompts[i]
            k += 1
        epoch += 1


def resumed_stream(prompts: list[Prompt], *, seed: int, shuffle: bool,
                   consumed: Iterable[int] = ()) -> Iterator[tuple[int, int, Prompt]]:
    """(stream position, epoch, prompt), skipping the positions already trained on (a resumed run)."""
    done = set(consumed)
    start = 0
    while start in done:
        start += 1
    for seq, (epoch, prompt) in enumerate(prompt_stream(prompts, seed=seed, shuffle=shuffle, start=start), start):
        if seq not in done:
            yield seq, epoch, prompt


class RolloutController:
    """Keeps up to max_concurrent_rollouts groups in flight across the live servers; see the module docstring."""

    def __init__(self, *, name_resolve: NameResolve, expected_servers: int, token: str, prompts: list[Prompt],
                 params: SamplingParams, reward: RewardScorer, decode: Callable[[list[int]], str],
                 batch_size: int, max_offpolicyness: int, max_concurrent: int, queue_size: int | None,
                 request_timeout: float, request_retries: int, setup_timeout: float, seed: int, shuffle: bool,
                 server_silence_timeout: float = 30.0, start_version: int = 0, consumed: Iterable[int] = (),
                 sampler: GroupSampler | None = None, schedule: SyncSchedule | None = None,
                 steps_done: int | None = None) -> None:
        if not prompts:
            raise StepError("the training set is empty")
        self.nr = name_resolve
        self.expected_servers = expected_servers
        self.token = token
        self.batch_size = batch_size
        self.max_offpolicyness = max_offpolicyness
        self.max_concurrent = max_concurrent
        self.queue_size = queue_size if queue_size is not None else 2 * batch_size
        self.request_timeout = request_timeout
        self.request_retries = request_retries
        self.setup_timeout = setup_timeout
        self.watch = ServerWatch(server_silence_timeout)
        self.silence = self.watch.silence
        self._stream = resumed_stream(prompts, seed=seed, shuffle=shuffle, consumed=consumed)
        # how a prompt becomes a group: one request (the default) or multi-turn episodes (rollout.agent.workflow)
        self.sampler: GroupSampler = sampler or SingleTurnGroups(params, reward, decode, seed)
        self.version = start_version
        # Admission counts groups relative to the resume point (the step resumed after; without a schedule, one
        # push per step, it is the version), so a resumed run starts generating at once.
        self.schedule = schedule or SyncSchedule()
        self._steps_done = start_version if steps_done is None else steps_done
        self._started = 0
        self.epoch = 0
        self._updating = False
        self._out: queue.Queue[Group | BaseException] = queue.Queue()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="rollout", daemon=True)
        self._ready = threading.Event()
        self._stopping = False
        self._wake: asyncio.Event | None = None
        self.pool: ServerPool | None = None
        self.servers: list[Server] = []
        self.verified: dict[int, str] = {}  # server index -> address that holds the current weights
        self.adapters: dict[int, str | None] = {}  # server index -> LoRA adapter of the current version (use_lora)
        self.pending: list[Server] = []  # live but not yet given the current weights (e.g. restarted)
        self.stats = RolloutStats()
        self._error: BaseException | None = None
        self.before_admit: Callable[[int], None] | None = None
        self.updates = 0  # weight updates begun so far: a request that saw this change may mix two versions

    # --- called from the trainer thread ------------------------------------------------------------------------

    def start(self) -> list[Server]:
        """Wait for the servers (setup_timeout) and start generating; returns the servers found."""
        self.servers = wait_for_servers(self.nr, self.expected_servers, self.setup_timeout, healthy=True)
        self._thread.start()
        if not self._ready.wait(timeout=60):
            raise StepError("the rollout thread did not start within 60 s")
        if self._error is not None:
            raise self._error
        return self.servers

    def get_batch(self, timeout: float) -> tuple[list[Group], RolloutStats]:
        """The next `batch_size` groups no older than the staleness bound; StepError after `timeout` s."""
        started = time.monotonic()
        groups: list[Group] = []
        while len(groups) < self.batch_size:
            left = timeout - (time.monotonic() - started)
            try:
                item = self._out.get(timeout=max(0.01, left))
            except queue.Empty:
                dropped = self.stats.dropped_episodes
                why = (f"{dropped} episodes were dropped meanwhile (the trainer's log says why)" if dropped else
                       "are the servers generating? (rlkit logs TRIAL --step server-0)")
                raise StepError(f"waited {timeout:.0f} s for {self.batch_size} rollout groups, got {len(groups)}; "
                                f"{why}") from None
            if isinstance(item, BaseException):
                raise item
            if self.version - item.version > self.max_offpolicyness:
                self.stats.dropped_stale += 1
                self._call_soon(self._replace_dropped)
                continue
            groups.append(item)
        groups.sort(key=lambda g: g.seq)  # stream order: a synchronous run trains in the same order every time
        self.stats.wait_s = time.monotonic() - started
        stats, self.stats = self.stats, RolloutStats()
        self._call_soon(self._admit_more)
        return groups, stats

    def begin_update(self) -> None:
        """Stop admitting groups while weights change (in-flight requests are paused by the servers)."""
        self._updating = True
        self.updates += 1

    def end_update(self, version: int) -> None:
        """The servers now serve `version`: admit groups again (after a one-shot `before_admit(version)`, which
        only fault-injection tests set)."""
        hook, self.before_admit = self.before_admit, None
        if hook is not None:
            hook(version)
        self.version = version
        self._updating = False
        self._call_soon(self._admit_more)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coro` on the controller's loop and return at once: the caller's thread may block meanwhile (e.g. in
        a weight broadcast whose receiving side these requests drive). Wait with `future.result(timeout)`."""
        if not self._thread.is_alive():
            coro.close()
            raise StepError("the rollout controller is not running (start it first)")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, make: Callable[[], Awaitable[T]], timeout: float, *, what: str) -> T:
        """Run a coroutine (e.g. a weight sync) on the controller's loop and wait for its result; StepError naming
        `what` after `timeout` s."""
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(make(), self._loop)  # type: ignore[arg-type]
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise StepError(f"{what}: not done after {timeout:g} s") from None

    def live_servers(self) -> list[Server]:
        """Every server registered and heart-beating now (verified or not), except those silent now."""
        silent = set(self.silence.silent)
        return [s for s in discover_servers(self.nr) if s.index not in silent]

    def wait_for_a_server(self) -> list[Server]:
        """The live servers (silent ones left out) once one is registered, waiting as long as a removed record takes
        to be written again (its owner's next heartbeat, well within the record's ttl); [] when none came."""
        deadline = time.monotonic() + RECORD_HEAL_WAIT_S
        while not (servers := self.live_servers()) and time.monotonic() < deadline:
            time.sleep(1.0)
        return servers

    async def guard_push(self, server: Server, call: Awaitable[T]) -> T:
        """One server's part of a weight push (PushTargets.guard): ServerUnreachable once the server is found silent
        (rlkit.rollout.silence.ServerWatch.guard)."""
        return await self.watch.guard(server, call)

    def why_servers_vanished(self) -> str:
        """Each server that held the weights: its record and whether it answers (for a no-server failure)."""
        return why_servers_vanished(self.nr, dict(self.verified))

    def mark_synced(self, servers: list[Server]) -> None:
        """These servers now hold the current weights: requests may go to them (and only to them)."""
        self.verified = {s.index: s.address for s in servers}
        self.adapters = {s.index: s.adapter for s in servers}  # LoRA: the adapter of the current version
        fresh = [Server(index=s.index, address=s.address, model=s.model, backend=s.backend, adapter=s.adapter)
                 for s in servers]

        def apply() -> None:
            if self.pool is not None and fresh:
                self.pool.set_servers(fresh)
                self.servers = self.pool.servers
            self.pending = [p for p in self.pending if self.verified.get(p.index) != p.address]

        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(apply)
        else:
            self.servers = fresh

    def stop(self) -> None:
        self._stopping = True
        if self._thread.is_alive():
            self._call_soon(lambda: None)
            async def close() -> None:
                for task in [t for t in asyncio.all_tasks(self._loop) if t is not asyncio.current_task()]:
                    task.cancel()
                if self.pool is not None:
                    await self.pool.aclose()
                await self.watch.aclose()
            with contextlib.suppress(Exception):  # best effort at shutdown
                asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    async def settled_version(self) -> tuple[int, int]:
        """On the controller's loop, once no weight update is under way: (the version the servers hold, the count of
        updates begun). The count is read first: an update beginning meanwhile (on the trainer's thread) changes it."""
        while True:
            updates = self.updates
            if not self._updating or self._stopping:
                return self.version, updates
            await asyncio.sleep(0.05)

    async def sample_at_one_version(self, sampler: GroupSampler, prompt: Prompt, seq: int
                                    ) -> tuple[SampledGroup, int, bool]:
        """On the controller's loop, outside the training stream (evaluation): once no weight update is under way,
        sample one group of `prompt` with `sampler` (its own sampling settings; `seq` seeds it); returns the group,
        the weight version it was requested at, and whether no update began before it finished (else its tokens
        may come from two versions)."""
        version, updates = await self.settled_version()
        assert self.pool is not None
        sampled = await sampler.sample(self.pool, prompt, version, seq, self._settled)
        return sampled, version, self.updates == updates and not self._updating

    # --- the loop thread -------------------------------------------------------------------------------------

    def _call_soon(self, fn: Callable[[], None]) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(fn)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self.pool = ServerPool(self.servers, self.token, timeout=self.request_timeout,
                                   retries=self.request_retries, max_in_flight=self.max_concurrent)
            self._in_flight = 0
            self._loop.create_task(self._watch_servers())
            self._admit_more()
        except BaseException as exc:
            self._error = exc
        self._ready.set()
        self._loop.run_forever()

    def _may_admit(self) -> bool:
        if self._stopping or self._updating:
            return False
        if self._in_flight >= self.max_concurrent:
            return False
        if self._out.qsize() + self._in_flight >= self.queue_size:
            return False
        batches = self.schedule.admission_batches(self.version, self.max_offpolicyness, self._steps_done)
        limit = batches * self.batch_size
        return self._started < limit

    def _replace_dropped(self) -> None:
        self._started -= 1  # a dropped group frees its place, so a fresh one is sampled with current weights
        self._admit_more()

    def _admit_more(self) -> None:
        while self._may_admit():
            seq, self.epoch, prompt = next(self._stream)
            self._started += 1
            self._in_flight += 1
            self._loop.create_task(self._rollout(prompt, self.version, seq))

    async def _settled(self) -> int:
        version, _ = await self.settled_version()
        return version

    async def _rollout(self, prompt: Prompt, version: int, seq: int) -> None:
        assert self.pool is not None
        started = time.monotonic()
        try:
            sampled = await self.sampler.sample(self.pool, prompt, version, seq, self._settled)
            if not sampled.samples:  # its episodes were dropped: another prompt takes its place
                self.stats.dropped_episodes += sampled.dropped_episodes
                self._started -= 1
                return
            group = Group(prompt, sampled.samples, version, sampled.server, time.monotonic() - started, seq,
                          reward_errors=sampled.reward_errors, reward_timeouts=sampled.reward_timeouts,
                          episodes=sampled.episodes)
            self.stats.reward_errors += group.reward_errors
            self.stats.reward_timeouts += group.reward_timeouts
            self.stats.per_server[group.server] = self.stats.per_server.get(group.server, 0) + 1
            self._out.put(group)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.stats.request_failures += 1
            self._out.put(exc if isinstance(exc, StepError) else StepError(f"a rollout failed: {exc!r}"))
        finally:
            self._in_flight -= 1
            self._admit_more()

    async def _watch_servers(self) -> None:
        """Follow name resolve: servers that stop heart-beating leave the pool, restarted ones join; ask each one
        GET /health, and take one that stays silent out of the pool (rlkit.rollout.silence)."""
        while not self._stopping:
            await asyncio.sleep(LIVENESS_POLL_S)
            try:
                live = await asyncio.to_thread(discover_servers, self.nr)
            except Exception:
                continue
            try:
                await self.watch.listen(live, self.pool)
            except Exception as exc:  # the watch must outlive one bad round (a closed client, an odd answer)
                print(f"rlkit train: the server watch skipped a round: {type(exc).__name__}: {exc}", flush=True)
            usable = [dataclasses.replace(s, adapter=self.adapters.get(s.index)) for s in live
                      if self.verified.get(s.index) == s.address and s.index not in self.silence.silent]
            self.pending = [s for s in live if self.verified.get(s.index) != s.address]
            if self.pool is not None and usable:
                self.pool.set_servers(usable)
                self.servers = self.pool.servers
