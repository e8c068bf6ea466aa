"""What only trainer rank 0 does in the GRPO algorithm (rlkit.jobs.grpo.algorithm): rollouts through the controller,
the weight push to every server and its check, the log-prob mismatch warnings, the step's metrics and progress fields.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from rlkit.agent.metrics import batch_metrics
from rlkit.config.allocation import parse_allocation
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.served_models import served_auxiliary_models
from rlkit.errors import StepError
from rlkit.jobs.grpo.waits import batch_wait_s
from rlkit.rewards.reasoning_gym import task_metrics
from rlkit.rollout.agent_setup import episode_groups, sampled_budget
from rlkit.rollout.controller import Group, RolloutController
from rlkit.rollout.groups import Prompt
from rlkit.rollout.sync_schedule import schedule_for
from rlkit.servers.pool import ServersUnreachable
from rlkit.slurm.faults import fault_point
from rlkit.trainer import mismatch, recover
from rlkit.trainer.evaluator import Evaluator
from rlkit.trainer.loop import StepFailed
from rlkit.trainer.rl_math.advantage_batch import prepare_batch
from rlkit.trainer.sampled_tokens import sampled_count
from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import read_json_dict, read_token
from rlkit.types import Sample
from rlkit.weights.base import Buckets, PushTargets, WeightTransport
from rlkit.weights.fanout import Probe, Published


def _serving_dtype(config: ExperimentConfig) -> str:
    """The dtype the servers (of the backend allocation_mode names) compute in; the trainer's when there are none."""
    from rlkit.servers.backend import backend_for

    server = parse_allocation(config.allocation_mode).server
    return backend_for(server.backend).serving_dtype(config) if server is not None else config.actor.dtype


def _float32_both_sides(config: ExperimentConfig) -> bool:
    """Servers and trainer both compute in float32."""
    return _serving_dtype(config) == "float32" and config.actor.dtype == "float32"


def weight_check_tolerance(config: ExperimentConfig) -> float:
    """actor.weight_check_tolerance, or its default for the two sides' dtypes: 1e-3 when both compute in float32;
    0.1 when both compute in the same 16-bit dtype; 0.3 when they differ, since a bf16 trainer's forward and a float32
    server loading the same bf16 export differed by 0.095-0.098 on average over 256 probe tokens on an H200
    (bench/bench_gpu.py, docs/development/benchmarks.md), too close to 0.1 for a check that must not stop a healthy
    run."""
    if config.actor.weight_check_tolerance is not None:
        return config.actor.weight_check_tolerance
    serving, training = _serving_dtype(config), config.actor.dtype
    if serving == training:
        return 1e-3 if training == "float32" else 0.1
    return 0.3


def logprob_mismatch_warn(config: ExperimentConfig) -> float:
    """actor.logprob_mismatch_warn, or its default for the dtypes (measured on the CPU demo: float32 servers and
    trainer differ by ~1e-6 on rollout tokens; bf16 kernels differ by a few 1e-2)."""
    if config.actor.logprob_mismatch_warn is not None:
        return config.actor.logprob_mismatch_warn
    return 1e-2 if _float32_both_sides(config) else 0.1


def _rollout_metrics(groups: list[Group], version: int, prepared_raw: list[float]) -> dict[str, float]:
    """A response's length is its sampled tokens (rlkit.trainer.sampled_tokens); the tokens rlkit inserted into
    multi-turn episodes are counted apart, and only when there are any."""
    samples = [s for g in groups for s in g.samples]
    lengths = [sampled_count(s) for s in samples]
    stale = [version - g.version for g in groups]
    out = {
        "reward/mean": statistics.fmean(prepared_raw),
        "reward/std": statistics.pstdev(prepared_raw),
        "reward/max": max(prepared_raw),
        "reward/min": min(prepared_raw),
        "response_length/mean": statistics.fmean(lengths),
        "response_length/max": max(lengths),
        "response/finished_fraction": statistics.fmean(float(s.finished) for s in samples),
        "staleness/mean": statistics.fmean(stale),
        "staleness/max": max(stale),
    }
    if any(s.loss_mask is not None for s in samples):
        out["response_length/inserted_mean"] = statistics.fmean(len(s.completion_ids) - sampled_count(s)
                                                                for s in samples)
    return out


def _reward_mix_metrics(reward: Any, names: list[str], groups: list[Group]) -> dict[str, float]:
    """reward.fns: each function's mean over the batch's samples, its errors and timeouts of the step."""
    from rlkit.rewards.mix import RewardMix, part_means

    if not isinstance(reward, RewardMix):
        return {}
    out = part_means([s.info for g in groups for s in g.samples], names)
    out.update(reward.step_counts())
    return out


class Rank0:
    """What only trainer rank 0 does: rollouts, weight sync, the step's metrics."""

    def __init__(self, config: ExperimentConfig, paths: TrialPaths, tokenizer: Any, prompts: list[Prompt],
                 steps: int, resumed: dict[str, Any] | None) -> None:
        from rlkit.nameresolve import name_resolve_for
        from rlkit.rewards.auxiliary import trial_environment
        from rlkit.rewards.failing import FailingRewards
        from rlkit.rewards.mix import reward_scorer, term_names
        from rlkit.servers.sampling import sampling_params

        self.config, self.paths, self.tokenizer, self.steps = config, paths, tokenizer, steps
        self.token = read_token(paths)
        self.n_prompts = len(prompts)
        alloc = parse_allocation(config.allocation_mode)
        assert alloc.server is not None
        self.backend = alloc.server.backend
        if config.gconfig.greedy:  # refused at submit (rlkit.checks.sampling): a group must sample
            raise StepError("gconfig.greedy is true: GRPO/PPO rollouts must sample (set gconfig.greedy=false, or use "
                            "eval_gconfig.greedy for evaluation)")
        # reward.fn, or the weighted mix of reward.fns; auxiliary models are found from the trial's environment
        self.reward = reward_scorer(config.reward, env=trial_environment(paths.root),
                                    prompt_key=config.train_dataset.prompt_key)
        self.reward_terms = term_names(config.reward)
        self.failing = FailingRewards(self.reward, config)  # a function failing on every call stops the trainer
        offpolicy = config.rollout.max_head_offpolicyness if config.async_training else 0
        self.schedule = schedule_for(config.actor)  # versions count pushes (rlkit.rollout.sync_schedule)
        self.version = int(resumed["version"]) if resumed is not None else 0
        steps_done = int(resumed.get("step", self.version)) if resumed is not None else 0
        self.pushed = True  # whether the last step pushed (step_metrics)
        self.consumed = (recover.expand_positions(resumed["consumed_prefix"], resumed["consumed_extra"])
                         if resumed is not None else set())
        sampler = episode_groups(config, tokenizer, self.reward)
        if sampler is not None:  # episodes: prompts whose rendered first prompt leaves no room for a turn are left out
            prompts = sampler.fitting(prompts)
        self.controller = RolloutController(
            name_resolve=name_resolve_for(config), expected_servers=alloc.server.dp, token=self.token,
            prompts=prompts, params=sampling_params(config),
            reward=self.reward, decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            batch_size=config.train_dataset.batch_size, max_offpolicyness=offpolicy,
            max_concurrent=config.rollout.max_concurrent_rollouts, queue_size=config.rollout.queue_size,
            request_timeout=config.rollout.request_timeout, request_retries=config.rollout.request_retries,
            setup_timeout=config.rollout.setup_timeout, server_silence_timeout=config.rollout.server_silence_timeout,
            seed=config.seed, shuffle=config.train_dataset.shuffle,
            start_version=self.version, consumed=self.consumed, sampler=sampler, schedule=self.schedule,
            steps_done=steps_done)
        self.controller.begin_update()  # no request before the servers are checked (and, resuming, updated)
        self.tolerance = weight_check_tolerance(config)
        self.mismatch_warn = logprob_mismatch_warn(config)
        self.mismatch_metrics: dict[str, float] = {}
        # the last one, for progress.json (rlkit status); a resumed attempt keeps the previous attempt's
        previous = read_json_dict(paths.progress) if resumed is not None else {}
        self.mismatch_warning = str(previous.get("logprob_mismatch_warning") or "")
        self.evaluator: Evaluator | None = None  # attach_evaluator
        self.eval_wait_s = 0.0  # the last push's wait for a running evaluation
        self.last_eval = {k: previous.get(k) for k in ("eval_reward", "eval_version")}
        self.server_versions: dict[int, int] = {}
        self.last_fingerprint: dict[int, float] = {}
        self.last_metrics: dict[str, float] = {}
        self.sync_phases: dict[str, float] = {}  # slowest server's seconds per sync phase (pause, reload, ...)
        self.write_s = 0.0
        self.sent_mb = 0.0  # what rank 0 sent toward the servers in the last push (WeightTransport.sent_bytes)
        self.servers_lost: set[int] = set()
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
        if served_auxiliary_models(self.config):  # before the first rollout: no reward function meets a starting server
            self._wait_for_auxiliary()
        servers = self.controller.start()
        token = self.token

        async def resume_all() -> None:  # a trainer that died during a push may have left servers paused
            async with server_client(token) as client:
                await asyncio.gather(*(backend_for(s.backend).resume(client, s, 60.0) for s in servers))

        self.controller.run(resume_all, timeout=120,  # each resume within 60 s: the gather's backstop
                            what=f"resuming the {len(servers)} servers (a trainer that died in a push may have left "
                                 "them paused)")
        print(f"rlkit train: {self.steps} steps; servers " + ", ".join(f"{s.index}@{s.address}" for s in servers),
              flush=True)

    def _wait_for_auxiliary(self) -> None:
        from rlkit.nameresolve import name_resolve_for
        from rlkit.rewards.auxiliary import wait_for_auxiliary

        with name_resolve_for(self.config) as nr:
            found = wait_for_auxiliary(self.config, nr, self.config.rollout.setup_timeout)
        print("rlkit train: auxiliary models " + "; ".join(f"{name} at {', '.join(addresses)}"
                                                           for name, addresses in found.items()), flush=True)

    def attach_evaluator(self, prompts: list[Prompt], *, on_startup: bool) -> None:
        """Evaluate on `prompts` as evaluator.freq_* says (rlkit.trainer.evaluator); `on_startup`: once now, too."""
        # sampled as training samples (single-turn, or the episodes of rollout.agent) at eval_gconfig's settings
        self.evaluator = Evaluator(self.config, prompts, self.controller, self.controller.sampler)
        if on_startup:
            self.evaluator.start()

    def next_batch(self) -> list[Sample] | str:
        """The next batch with advantages, or why there is none (broadcast so the other ranks stop too)."""
        try:
            self._step_started = time.monotonic()
            self._groups, self._rollout_stats = self.controller.get_batch(batch_wait_s(self.config))
            self.failing.check()
            if fault_point("rollout_fails", self.version + 1):  # tests: a batch that came but cannot be used
                raise StepError(f"fault injected: rollout_fails@{self.version + 1}")
            self._prepared = prepare_batch([g.samples for g in self._groups], self.config.actor,
                                           max_new_tokens=sampled_budget(self.config))
            self.consumed.update(g.seq for g in self._groups)  # only a batch that will be trained is consumed
            return list(self._prepared.samples)
        except ServersUnreachable as exc:
            self._pending_error = exc
            return str(exc)
        except BaseException as exc:
            self._pending_error = exc
            return f"trainer rank 0 failed: {type(exc).__name__}: {exc}"

    def before_push(self, version: int) -> list[Any]:
        """Rank 0 alone before a weight push (the other ranks wait in its broadcast group: rlkit.jobs.grpo.waits):
        a running evaluation ends at the version it began with (within rollout.request_timeout); the servers to push
        `version` to, every live one (restarted ones too: they get the weights before any request)."""
        self.eval_wait_s = self.evaluator.wait_before_push() if self.evaluator is not None else 0.0
        servers = self.controller.live_servers() or self.controller.wait_for_a_server()
        if not servers:
            raise StepError(f"no live inference server to push weight version {version} to; "
                            f"{self.controller.why_servers_vanished()}; see the server-N logs")
        return servers

    def publish(self, transport: WeightTransport, buckets: Buckets, version: int, probe: list[int],
                trainer_lp: list[float], servers: list[Any]) -> None:
        """Rank 0's part of the collective weight push (every rank runs `buckets` through `transport`): `version` to
        `servers` (`before_push`'s), then versions and fingerprints are checked (rlkit.weights.fanout)."""
        from rlkit.weights import fanout

        published = fanout.publish(transport, buckets, version, self._targets(servers), self._probe(probe, trainer_lp))
        assert published is not None
        done = published.synced
        self.sync_phases = {name: max(r.phases.get(name, 0.0) for r in done)
                            for name in sorted({n for r in done for n in r.phases})}
        self.write_s = transport.timings.get("write", 0.0)
        self.sent_mb = transport.sent_bytes / 1e6
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
        published = fanout.verify(self._targets(servers), self._probe(probe, trainer_lp))
        self._record(0, servers, published)

    def _probe(self, probe: list[int], trainer_lp: list[float]) -> Probe:
        """The fingerprint check, its probe allowed to queue behind the servers' generation (Probe.queue_s)."""
        return Probe(probe, trainer_lp, self.tolerance, queue_s=self.config.rollout.request_timeout)

    def _targets(self, servers: list[Any]) -> PushTargets:
        from rlkit.servers.http import server_client

        token = self.token
        return PushTargets(servers=servers, timeout=self.config.actor.weight_update_timeout,
                           submit=self.controller.submit, open_client=lambda: server_client(token),
                           begin_update=self.controller.begin_update, guard=self.controller.guard_push)

    def _record(self, version: int, servers: list[Any], published: Published) -> None:
        results = {r.index: (r.version, r.fingerprint or 0.0) for r in published.synced}
        lost = published.lost
        self.controller.mark_synced([s for s in servers if s.index in results])
        self.servers_lost = {s.index for s in lost}
        if lost:
            print(f"rlkit train: servers {sorted(s.index for s in lost)} are unreachable; going on with "
                  f"{sorted(results)} (a restarted server gets the weights before any request)", flush=True)
        self.version = version
        self.server_versions = {index: v for index, (v, _) in results.items()}
        self.last_fingerprint = {index: diff for index, (_, diff) in results.items()}
        print(f"rlkit train: servers {sorted(results)} at weight version {version}, fingerprint "
              f"max |dlogp| {max(self.last_fingerprint.values()):.2e} (tolerance {self.tolerance:g})", flush=True)

    def epoch(self, step: int) -> int:
        """The epoch `step` finishes in (whole passes over the prompts)."""
        return (step * self.config.train_dataset.batch_size) // self.n_prompts

    def note_mismatch(self, per_server: dict[int, mismatch.ServerMismatch], version: int) -> None:
        """The step's log-prob mismatch (rlkit.trainer.mismatch): metrics for finish_step, a warning line per server
        over actor.logprob_mismatch_warn (also kept for `rlkit status`)."""
        self.mismatch_metrics = mismatch.metrics(per_server)
        for line in mismatch.warnings(per_server, threshold=self.mismatch_warn, version=version,
                                      addresses={s.index: s.address for s in self.controller.servers}):
            self.mismatch_warning = line
            print(f"rlkit train: {line}", flush=True)

    def step_metrics(self, step: int, train_stats: dict[str, float], timing: dict[str, float]) -> dict[str, float]:
        """The metrics of `step` (its batch's rollouts, the training statistics, the sync)."""
        groups, rs, prepared = self._groups, self._rollout_stats, self._prepared
        elapsed = max(1e-9, time.monotonic() - self._step_started)
        n_samples = sum(len(g.samples) for g in groups)
        n_tokens = sum(sampled_count(s) for g in groups for s in g.samples)  # generated, not inserted
        metrics = _rollout_metrics(groups, self.schedule.pushes_after(step - 1), prepared.raw_rewards)
        metrics.update(batch_metrics([e for g in groups for e in g.episodes]))  # multi-turn episodes only
        metrics.update(self.controller.sampler.metrics())  # multi-turn: per tool calls, errors, timeouts, seconds
        metrics.update(train_stats)
        metrics.update(timing)
        metrics.update(_reward_mix_metrics(self.reward, self.reward_terms, groups))
        metrics.update(task_metrics((g.prompt.row, g.samples) for g in groups))  # reasoning-gym: per task
        metrics.update(self.mismatch_metrics)
        self.mismatch_metrics = {}
        if not self.pushed:  # no push this step: nothing was written or sent
            self.write_s, self.sent_mb, self.sync_phases = 0.0, 0.0, {}
        metrics["timing/sync_write"] = self.write_s
        metrics["weight_sync/trainer_sent_mb"] = self.sent_mb
        metrics.update({f"timing/sync_{name}": seconds for name, seconds in self.sync_phases.items()})
        metrics.update({
            "version": step, "epoch": (step * self.config.train_dataset.batch_size) / self.n_prompts,
            "rollout/samples_per_s": n_samples / elapsed, "rollout/tokens_per_s": n_tokens / elapsed,
            "rollout/dropped_stale_groups": rs.dropped_stale, "rollout/request_failures": rs.request_failures,
            "rollout/dropped_episodes": rs.dropped_episodes,
            "rollout/dynamic_sampling_dropped": prepared.dropped_groups,
            "reward/errors": rs.reward_errors, "reward/timeouts": rs.reward_timeouts,
            "weight_sync/fingerprint_max_diff": max(self.last_fingerprint.values(), default=0.0),
            "weight_sync/servers_at_version": sum(v == self.version for v in self.server_versions.values()),
            "weight_sync/version": self.version, "weight_sync/pushed": float(self.pushed),
            "weight_sync/server_version_min": min(self.server_versions.values(), default=0),
            "servers/unreachable": len(self.servers_lost | self.controller.silence.silent),
            "data/seq_min": min(g.seq for g in groups), "data/seq_max": max(g.seq for g in groups),
            "rollout/rerouted_requests": self.controller.pool.rerouted if self.controller.pool else 0,
        })
        if self.evaluator is not None:  # after the push: an evaluation started now is of weight version `step`
            metrics["timing/eval_wait"] = self.eval_wait_s
            metrics.update(self.evaluator.after_step(step, self.epoch(step), last=step == self.steps))
            self.last_eval = self.evaluator.progress() or self.last_eval
        self.last_metrics = metrics
        return metrics

    def summary(self, metrics: dict[str, float]) -> str:
        return (f"reward {metrics['reward/mean']:.3f} staleness {metrics['staleness/mean']:.2f} servers at "
                f"v{int(metrics['weight_sync/version'])} "
                f"(fingerprint diff {metrics['weight_sync/fingerprint_max_diff']:.2e}, "
                f"rollout logprob mismatch {metrics.get(mismatch.METRIC + '_mean', float('nan')):.2e})")

    def state(self, step: int) -> dict[str, Any]:
        """What a resumed Rank0 continues from after `step`: the weight version (the pushes so far: a resumed trainer
        pushes its weights as that version first), the step and the prompt-stream positions trained on."""
        prefix, extra = recover.compress_positions(self.consumed)
        return {"version": self.schedule.pushes_after(step), "step": step, "consumed_prefix": prefix,
                "consumed_extra": extra}

    def progress(self) -> dict[str, Any]:
        """GRPO's fields of progress.json (`rlkit status`)."""
        return {"version": self.version, "reward": self.last_metrics.get("reward/mean"),
                "servers": {str(k): v for k, v in self.server_versions.items()},
                "logprob_mismatch_warning": self.mismatch_warning or None, **self.last_eval}

    def finish(self) -> None:
        print(f"rlkit train: done; metrics in {self.paths.metrics}, final model in {self.paths.checkpoints / 'final'}",
              flush=True)

    def abort(self, exc: BaseException) -> None:
        """Fails with the error rank 0 met while getting the batch (the other ranks only learnt that it failed; its type
        decides whether the job retries), with what the loop did before failing (the checkpoint it saved: with one
        rank, no other rank's message says it)."""
        error = self._pending_error
        self.close()
        if error is not None and error is not exc:
            note = exc.note if isinstance(exc, StepFailed) else ""
            if note and isinstance(error, StepError):
                error.args = (f"{error}; {note}",)  # what `rlkit train` prints as the step's failure
            elif note:
                error.add_note(note)
            raise error from exc

    def close(self) -> None:
        self.controller.stop()
        self.reward.close()
