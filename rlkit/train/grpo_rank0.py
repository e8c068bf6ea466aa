"""What only trainer rank 0 does in the GRPO loop (rlkit.train.grpo): rollouts through the controller, the weight push
to every server and its check, metrics, progress, and the saver and recover checkpoints' rank-0 parts.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.config.allocation import parse_allocation
from rlkit.config.schema import ExperimentConfig
from rlkit.errors import StepError
from rlkit.paths import TrialPaths
from rlkit.rollout.client import ServersUnreachable
from rlkit.rollout.controller import Group, Prompt, RolloutController
from rlkit.train import mismatch, recover
from rlkit.train.advantage_batch import prepare_batch
from rlkit.train.batch import Sample
from rlkit.train.engine import DTYPES
from rlkit.train.faults import fault_point
from rlkit.trials import read_json_dict, read_token, write_atomic
from rlkit.weights.base import Buckets, PushTargets, WeightTransport, drain
from rlkit.weights.fanout import Published

EXIT_REQUEUE = 75  # USR1: checkpoint, then progress.json status "requeue" (the batch script requeues the job)
EXIT_STOPPED = 76  # USR2 (`rlkit stop`): checkpoint, then status "stopped" (the job ends)
EXIT_SERVERS_GONE = 77  # no server reachable for a weight push: checkpoint, then fail (the in-job retry resumes)


def _float32_both_sides(config: ExperimentConfig) -> bool:
    """Servers (of the backend allocation_mode names) and trainer both compute in float32."""
    from rlkit.servers.backend import backend_for

    server = parse_allocation(config.allocation_mode).server
    serving = backend_for(server.backend).serving_dtype(config) if server is not None else config.actor.dtype
    return serving == "float32" and config.actor.dtype == "float32"


def weight_check_tolerance(config: ExperimentConfig) -> float:
    if config.actor.weight_check_tolerance is not None:
        return config.actor.weight_check_tolerance
    return 1e-3 if _float32_both_sides(config) else 0.1


def logprob_mismatch_warn(config: ExperimentConfig) -> float:
    """actor.logprob_mismatch_warn, or its default for the dtypes (measured on the CPU demo: float32 servers and
    trainer differ by ~1e-6 on rollout tokens; bf16 kernels differ by a few 1e-2)."""
    if config.actor.logprob_mismatch_warn is not None:
        return config.actor.logprob_mismatch_warn
    return 1e-2 if _float32_both_sides(config) else 0.1


@dataclass
class Saver:
    """Decides when to save a Hugging Face checkpoint (saver.freq_steps / freq_epochs / freq_secs)."""

    freq_steps: int | None
    freq_epochs: int | None
    freq_secs: int | None
    last_time: float
    last_epoch: int = 0

    def due(self, step: int, epoch: int, now: float) -> bool:
        hit = bool(self.freq_steps and step % self.freq_steps == 0)
        hit |= bool(self.freq_epochs and epoch > self.last_epoch and epoch % self.freq_epochs == 0)
        hit |= bool(self.freq_secs and now - self.last_time >= self.freq_secs)
        if hit:
            self.last_time, self.last_epoch = now, epoch
        return hit


def _drop_metrics_after(path: Path, step: int) -> None:
    """Resuming after `step`: move the metrics of later (lost) steps out of metrics.jsonl, so steps stay unique."""
    if not path.is_file():
        return
    kept: list[str] = []
    dropped: list[str] = []
    for line in path.read_text().splitlines():
        try:
            record_step = json.loads(line).get("step", 0)
        except ValueError:
            continue  # a line cut by the crash
        (kept if record_step <= step else dropped).append(line)
    if dropped:
        with open(path.with_name("metrics.discarded.jsonl"), "a") as f:
            f.write("\n".join(dropped) + "\n")
    write_atomic(path, "".join(line + "\n" for line in kept))


def _rollout_metrics(groups: list[Group], version: int, prepared_raw: list[float]) -> dict[str, float]:
    lengths = [len(s.completion_ids) for g in groups for s in g.samples]
    stale = [version - g.version for g in groups]
    return {
        "reward/mean": statistics.fmean(prepared_raw),
        "reward/std": statistics.pstdev(prepared_raw),
        "reward/max": max(prepared_raw),
        "reward/min": min(prepared_raw),
        "response_length/mean": statistics.fmean(lengths),
        "response_length/max": max(lengths),
        "response/finished_fraction": statistics.fmean(float(s.finished) for g in groups for s in g.samples),
        "staleness/mean": statistics.fmean(stale),
        "staleness/max": max(stale),
    }


class Rank0:
    """What only trainer rank 0 does: rollouts, weight sync, metrics, checkpoints."""

    def __init__(self, config: ExperimentConfig, paths: TrialPaths, tokenizer: Any, prompts: list[Prompt],
                 steps: int, resumed: recover.TrainerState | None) -> None:
        from rlkit.nameresolve import name_resolve_for
        from rlkit.rewards import resolve_reward_fn
        from rlkit.rewards.runner import RewardRunner
        from rlkit.servers.backend import SamplingParams
        from rlkit.train.stats_logger import StatsLogger

        self.config, self.paths, self.tokenizer, self.steps = config, paths, tokenizer, steps
        self.token = read_token(paths)
        self.n_prompts = len(prompts)
        alloc = parse_allocation(config.allocation_mode)
        assert alloc.server is not None
        self.backend = alloc.server.backend
        g = config.gconfig
        self.reward = RewardRunner(resolve_reward_fn(config.reward.fn, config.reward.answer_key),
                                   config.reward.timeout)
        offpolicy = config.rollout.max_head_offpolicyness if config.async_training else 0
        self.version = resumed.version if resumed is not None else 0
        self.consumed = (recover.expand_positions(resumed.consumed_prefix, resumed.consumed_extra)
                         if resumed is not None else set())
        self.controller = RolloutController(
            name_resolve=name_resolve_for(config), expected_servers=alloc.server.dp, token=self.token,
            prompts=prompts, params=SamplingParams(n=g.n_samples, max_new_tokens=g.max_new_tokens,
                                                   temperature=g.temperature, top_p=g.top_p, top_k=g.top_k,
                                                   stop=list(g.stop)),
            reward=self.reward, decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            batch_size=config.train_dataset.batch_size, max_offpolicyness=offpolicy,
            max_concurrent=config.rollout.max_concurrent_rollouts, queue_size=config.rollout.queue_size,
            request_timeout=config.rollout.request_timeout, request_retries=config.rollout.request_retries,
            setup_timeout=config.rollout.setup_timeout, seed=config.seed, shuffle=config.train_dataset.shuffle,
            start_version=self.version, consumed=self.consumed)
        self.controller.begin_update()  # no request before the servers are checked (and, resuming, updated)
        if resumed is not None:
            _drop_metrics_after(paths.metrics, resumed.step)
        self.logger = StatsLogger(config.stats_logger, paths, experiment=config.experiment_name,
                                  trial=config.trial_name)
        self.saver = Saver(config.saver.freq_steps, config.saver.freq_epochs, config.saver.freq_secs,
                           time.monotonic())
        self.recover_saver = Saver(config.recover.freq_steps, config.recover.freq_epochs, config.recover.freq_secs,
                                   time.monotonic())
        self.tolerance = weight_check_tolerance(config)
        self.mismatch_warn = logprob_mismatch_warn(config)
        self.mismatch_metrics: dict[str, float] = {}
        # the last one, for progress.json (rlkit status); a resumed attempt keeps the previous attempt's
        previous = read_json_dict(paths.progress) if resumed is not None else {}
        self.mismatch_warning = str(previous.get("logprob_mismatch_warning") or "")
        self.server_versions: dict[int, int] = {}
        self.last_fingerprint: dict[int, float] = {}
        self.last_metrics: dict[str, float] = {}
        self.sync_phases: dict[str, float] = {}  # slowest server's seconds per sync phase (pause, reload, ...)
        self.write_s = 0.0
        self.servers_lost = 0
        self.servers_gone = ""  # set when a weight push found no reachable server
        self._pending_error: BaseException | None = None
        self._groups: list[Group] = []
        self._rollout_stats: Any = None
        self._prepared: Any = None
        self._step_started = time.monotonic()

    def start(self, transport: WeightTransport) -> None:
        from rlkit.servers.backend import backend_for
        from rlkit.servers.http import server_client

        transport.start()  # drops what a previous attempt left (its versions are stale)
        servers = self.controller.start()
        token = self.token

        async def resume_all() -> None:  # a trainer that died during a push may have left servers paused
            async with server_client(token) as client:
                await asyncio.gather(*(backend_for(s.backend).resume(client, s, 60.0) for s in servers))

        self.controller.run(resume_all, timeout=120)
        print(f"rlkit train: {self.steps} steps; servers " + ", ".join(f"{s.index}@{s.address}" for s in servers),
              flush=True)

    def next_batch(self) -> list[Sample] | str:
        """The next batch with advantages, or why there is none (broadcast so the other ranks stop too)."""
        try:
            self._step_started = time.monotonic()
            timeout = self.config.rollout.request_timeout * (self.config.rollout.request_retries + 1) + 60
            self._groups, self._rollout_stats = self.controller.get_batch(timeout)
            if fault_point("rollout_fails", self.version + 1):  # tests: a batch that came but cannot be used
                raise StepError(f"fault injected: rollout_fails@{self.version + 1}")
            self._prepared = prepare_batch([g.samples for g in self._groups], self.config.actor,
                                           max_new_tokens=self.config.gconfig.max_new_tokens)
            self.consumed.update(g.seq for g in self._groups)  # only a batch that will be trained is consumed
            return list(self._prepared.samples)
        except ServersUnreachable as exc:
            self._pending_error = exc
            return str(exc)
        except BaseException as exc:
            self._pending_error = exc
            return f"trainer rank 0 failed: {type(exc).__name__}: {exc}"

    def publish(self, transport: WeightTransport, buckets: Buckets, version: int, probe: list[int],
                trainer_lp: list[float]) -> None:
        """Rank 0's part of the collective weight push (every rank runs `buckets` through `transport`): `version` to
        every live server (restarted ones too: they get the weights before any request), then versions and
        fingerprints are checked (rlkit.weights.fanout)."""
        from rlkit.weights import fanout

        try:
            servers = self.controller.live_servers()
            if not servers:
                raise StepError(f"no live inference server to push weight version {version} to; see the server-N "
                                "logs")
        except BaseException:
            drain(buckets)  # the other ranks are in the gathers behind the iterator: finish them, then fail
            raise
        published = fanout.publish(transport, buckets, version, self._targets(servers),
                                   fanout.Probe(probe, trainer_lp, self.tolerance))
        assert published is not None
        done = published.synced
        self.sync_phases = {name: max(r.phases.get(name, 0.0) for r in done)
                            for name in sorted({n for r in done for n in r.phases})}
        self.write_s = transport.timings.get("write", 0.0)
        self._record(version, servers, published)
        # Only now admit groups: the pool must first learn each server's new adapter (LoRA, via mark_synced in
        # _record); a group admitted before would name the previous, already unloaded one.
        self.controller.end_update(version)

    def verify(self, probe: list[int], trainer_lp: list[float]) -> None:
        """Before the first push: the servers must serve the very weights the trainer starts from (the fingerprint),
        which also catches a dtype or tokenizer mismatch before step 1."""
        from rlkit.weights import fanout

        servers = list(self.controller.servers)  # at start only those that answer
        if not servers:
            raise StepError("no live inference server to check the weights of; see the server-N logs")
        published = fanout.verify(self._targets(servers), fanout.Probe(probe, trainer_lp, self.tolerance))
        self._record(0, servers, published)

    def _targets(self, servers: list[Any]) -> PushTargets:
        from rlkit.servers.http import server_client

        token = self.token
        return PushTargets(servers=servers, timeout=self.config.actor.weight_update_timeout,
                           submit=self.controller.submit, open_client=lambda: server_client(token),
                           begin_update=self.controller.begin_update)

    def _record(self, version: int, servers: list[Any], published: Published) -> None:
        results = {r.index: (r.version, r.fingerprint or 0.0) for r in published.synced}
        lost = published.lost
        self.controller.mark_synced([s for s in servers if s.index in results])
        self.servers_lost = len(lost)
        if lost:
            print(f"rlkit train: servers {sorted(s.index for s in lost)} are unreachable; going on with "
                  f"{sorted(results)} (a restarted server gets the weights before any request)", flush=True)
        self.version = version
        self.server_versions = {index: v for index, (v, _) in results.items()}
        self.last_fingerprint = {index: diff for index, (_, diff) in results.items()}
        print(f"rlkit train: servers {sorted(results)} at weight version {version}, fingerprint "
              f"max |dlogp| {max(self.last_fingerprint.values()):.2e} (tolerance {self.tolerance:g})", flush=True)

    def saves_due(self, step: int) -> list[str]:
        """The saver checkpoints to write after `step` (names under checkpoints/): the full weights are gathered for
        them on these steps only."""
        epoch = (step * self.config.train_dataset.batch_size) // self.n_prompts
        names = [f"step{step}"] if self.saver.due(step, epoch, time.monotonic()) else []
        return [*names, "final"] if step == self.steps else names

    def note_mismatch(self, per_server: dict[int, mismatch.ServerMismatch], version: int) -> None:
        """The step's log-prob mismatch (rlkit.train.mismatch): metrics for finish_step, a warning line per server
        over actor.logprob_mismatch_warn (also kept for `rlkit status`)."""
        self.mismatch_metrics = mismatch.metrics(per_server)
        for line in mismatch.warnings(per_server, threshold=self.mismatch_warn, version=version,
                                      addresses={s.index: s.address for s in self.controller.servers}):
            self.mismatch_warning = line
            print(f"rlkit train: {line}", flush=True)

    def finish_step(self, step: int, state: dict[str, Any] | None, saves: list[str], train_stats: dict[str, float],
                    timing: dict[str, float]) -> None:
        groups, rs, prepared = self._groups, self._rollout_stats, self._prepared
        elapsed = max(1e-9, time.monotonic() - self._step_started)
        n_samples = sum(len(g.samples) for g in groups)
        n_tokens = sum(len(s.completion_ids) for g in groups for s in g.samples)
        metrics = _rollout_metrics(groups, step - 1, prepared.raw_rewards)
        metrics.update(train_stats)
        metrics.update(timing)
        metrics.update(self.mismatch_metrics)
        self.mismatch_metrics = {}
        metrics["timing/sync_write"] = self.write_s
        metrics.update({f"timing/sync_{name}": seconds for name, seconds in self.sync_phases.items()})
        metrics.update({
            "version": step, "epoch": (step * self.config.train_dataset.batch_size) / self.n_prompts,
            "rollout/samples_per_s": n_samples / elapsed, "rollout/tokens_per_s": n_tokens / elapsed,
            "rollout/dropped_stale_groups": rs.dropped_stale, "rollout/request_failures": rs.request_failures,
            "rollout/dynamic_sampling_dropped": prepared.dropped_groups,
            "reward/errors": rs.reward_errors, "reward/timeouts": rs.reward_timeouts,
            "weight_sync/fingerprint_max_diff": max(self.last_fingerprint.values(), default=0.0),
            "weight_sync/servers_at_version": sum(v == step for v in self.server_versions.values()),
            "servers/unreachable": self.servers_lost,
            "data/seq_min": min(g.seq for g in groups), "data/seq_max": max(g.seq for g in groups),
            "rollout/rerouted_requests": self.controller.pool.rerouted if self.controller.pool else 0,
        })
        self.logger.log(step, metrics)
        self.last_metrics = metrics
        for name in saves:
            assert state is not None
            self._save(state, self.paths.checkpoints / name)
        self._progress(step, "running")
        print(f"rlkit train: step {step}/{self.steps} reward {metrics['reward/mean']:.3f} "
              f"staleness {metrics['staleness/mean']:.2f} servers at v{step} "
              f"(fingerprint diff {metrics['weight_sync/fingerprint_max_diff']:.2e}, rollout logprob mismatch "
              f"{metrics.get(mismatch.METRIC + '_mean', float('nan')):.2e}) "
              f"step {timing['timing/step']:.1f}s", flush=True)

    def checkpoint_decision(self, step: int, requested: int | None) -> tuple[bool, int | None]:
        """(write a recover checkpoint now?, exit code to stop with after it or None)."""
        if self.servers_gone:
            return False, EXIT_SERVERS_GONE  # the loop checkpoints (_save_before_failing) and fails
        if self.config.recover.mode == "disabled":
            return False, (EXIT_STOPPED if requested == EXIT_STOPPED else None)
        epoch = (step * self.config.train_dataset.batch_size) // self.n_prompts
        due = self.recover_saver.due(step, epoch, time.monotonic())
        if step == self.steps:
            return False, None  # finished: checkpoints/final is the result, nothing to resume
        return due or requested is not None, requested

    def write_recover(self, tmp: Path, step: int, optimizer_steps: int, started: float,
                      digests: dict[str, tuple[int, str]]) -> None:
        """Rank 0, after every rank wrote its shards into `tmp`: trainer state, manifest, rename, prune."""
        prefix, extra = recover.compress_positions(self.consumed)
        state = recover.TrainerState(step=step, version=step, consumed_prefix=prefix, consumed_extra=extra,
                                     optimizer_steps=optimizer_steps, rng=recover.rng_state(), saved_at=time.time())
        (tmp / recover.STATE).write_text(state.to_json())
        root = recover.recover_root(self.paths.root)
        final = recover.checkpoint_dir(root, step)
        recover.seal(tmp, final, digests)  # replaces a same-step one (resumed from an older one) only once sealed
        recover.prune(root, self.config.recover.keep_last)
        print(f"rlkit train: recover checkpoint of step {step} in {final} ({time.monotonic() - started:.2f} s)",
              flush=True)

    def stop_for(self, exit_code: int) -> None:
        status = {EXIT_REQUEUE: "requeue", EXIT_STOPPED: "stopped"}.get(exit_code, "failed: servers unreachable")
        self._progress(self.version, status)
        self.close()
        print(f"rlkit train: checkpointed and stopping ({status})", flush=True)

    def _save(self, state: dict[str, Any], out_dir: Path) -> None:
        from rlkit.weights import hf_export

        # a resume from an older recover checkpoint reaches this step again: the new save replaces the old one
        hf_export.write_weights(state, Path(self.config.actor.path), out_dir, dtype=DTYPES[self.config.actor.dtype],
                             replace=True)
        print(f"rlkit train: saved {out_dir}", flush=True)

    def _progress(self, step: int, status: str) -> None:
        write_atomic(self.paths.progress, json.dumps({
            "status": status, "step": step, "total_steps": self.steps, "version": self.version,
            "reward": self.last_metrics.get("reward/mean"), "servers": {str(k): v for k, v in
                                                                        self.server_versions.items()},
            "logprob_mismatch_warning": self.mismatch_warning or None, "updated": time.time(),
        }, indent=1))

    def finish(self) -> None:
        self._progress(self.steps, "finished")
        self.close()
        print(f"rlkit train: done; metrics in {self.paths.metrics}, final model in {self.paths.checkpoints / 'final'}",
              flush=True)

    def abort(self, exc: BaseException) -> None:
        error = getattr(self, "_pending_error", None)
        self._progress(self.version, f"failed: {type(exc).__name__}")
        self.close()
        if error is not None and error is not exc:
            raise error from exc

    def close(self) -> None:
        self.controller.stop()
        self.reward.close()
        self.logger.close()
