"""The training loop every algorithm runs in (`rlkit train`): one process per trainer rank.

The loop owns what does not depend on the algorithm: the process group, the resume point (recover.mode), the stop
requests (USR1: Slurm's time-limit warning, USR2: `rlkit stop`), recover checkpoints of every engine the algorithm
holds plus its JSON state, the saver's Hugging Face checkpoints, progress.json, metrics and the exit protocol. An
algorithm (grpo, ppo, sft, rw, dpo in rlkit.trainer) plugs in through `Algorithm`; its step is collective and returns
its metrics.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import StepError, disk_full
from rlkit.slurm.faults import failed_before, fault_point
from rlkit.slurm.jobenv import JobEnv
from rlkit.step_contract import (
    EXIT_FAILING,
    EXIT_REQUEUE,
    EXIT_STOPPED,
    STATUS_FINISHED,
    STATUS_REQUEUE,
    STATUS_STOPPED,
)
from rlkit.trainer import out_of_memory, recover
from rlkit.trainer.dist import DistEnv, TrainerWaits, broadcast_object, dist_env_from, init_distributed
from rlkit.trainer.engine import TrainEngine
from rlkit.trainer.loop_rank0 import LoopRank0, checkpoint_wait_s, recording
from rlkit.trainer.out_of_memory import OutOfMemory
from rlkit.trainer.rank_files import DamagedCheckpoint
from rlkit.trainer.rank_watch import RankWatch
from rlkit.trainer.skipped_steps import skipped_metrics
from rlkit.trainer.stop_requests import StopRequests
from rlkit.trials.paths import TrialPaths

EXPORTED = "actor"  # the engine whose weights the saver writes (the trained model of every job type)


@dataclass
class LoopContext:
    """What an algorithm is built from."""

    config: ExperimentConfig
    paths: TrialPaths
    env: DistEnv
    device: torch.device


@dataclass
class StepResult:
    """One finished step. `fail` (rank 0's counts): the algorithm cannot go on; the loop records the step,
    checkpoints it and fails with this message on every rank."""

    metrics: dict[str, float] = field(default_factory=dict)  # rank 0's; empty elsewhere
    fail: str = ""


class StepNotStarted(Exception):
    """Raised by `Algorithm.step` on every rank when the step could not start (no batch): the loop checkpoints the
    last finished step, so a retry loses nothing, and fails with this message."""


class StepFailed(StepError):
    """A step that did not start, with what the loop did before failing (`note`, e.g. the checkpoint it saved):
    `Algorithm.abort` may fail with an error of its own instead, and keeps the note with it."""

    def __init__(self, reason: str, note: str) -> None:
        super().__init__(f"{reason}; {note}" if note else reason)
        self.note = note


class Algorithm(Protocol):
    """What the loop asks of an algorithm. Methods marked collective run on every rank in the same order."""

    engines: dict[str, TrainEngine]  # by name ("actor", "critic"): checkpointed and resumed by the loop
    total_steps: int  # the same on every rank

    def start(self, resumed: dict[str, Any] | None) -> None:
        """Collective: ready to train, from scratch or from the algorithm's state of a recover checkpoint (the
        engines are loaded already)."""

    def step(self, step: int) -> StepResult:
        """Collective: one training step (raises StepNotStarted on every rank when it cannot start)."""

    def epoch(self, step: int) -> int:
        """Rank 0: the epoch `step` finishes in (for the savers' freq_epochs)."""

    def state(self, step: int) -> dict[str, Any]:
        """Rank 0: JSON that `start` continues from, after `step`."""

    def progress(self) -> dict[str, Any]:
        """Rank 0: the algorithm's fields of progress.json (shown by `rlkit status`)."""

    def summary(self, metrics: dict[str, float]) -> str:
        """Rank 0: the step's line in the log, after "rlkit train: step k/n"."""

    def finish(self) -> None:
        """Rank 0: the last step is done."""

    def abort(self, exc: BaseException) -> None:
        """Rank 0: the loop fails with `exc` (may raise the error that caused it)."""

    def close(self) -> None:
        """Every rank, at the end whatever happened: release servers, threads, transports (idempotent)."""

    # Optional: `write_model(state, out_dir)` (rank 0) writes the saver's checkpoint of a model that is not a causal
    # LM (rw's reward model with its head); without it the saver writes the actor's weights as a causal LM.


def resume_point(config: ExperimentConfig, paths: TrialPaths, below: int | None = None) -> tuple[int, str] | None:
    """Rank 0: the checkpoint to resume from (of a step before `below`: a newer one was damaged), by recover.mode;
    StepError for mode resume with none. Its rank files' checksums are checked while they load."""
    mode = config.recover.mode
    if mode == "disabled" or (mode == "fault" and not failed_before()):
        return None  # before checksumming anything: nothing would be resumed
    found = recover.latest_valid(recover.recover_root(paths.root), defer_rank_files=True, below=below)
    if mode == "resume" and found is None:
        raise StepError(f"recover.mode is resume but {recover.recover_root(paths.root)} holds no valid checkpoint")
    return (found[0], str(found[1])) if found is not None else None


def run_training(trial_dir: Path, config: ExperimentConfig, build: Callable[[LoopContext], Algorithm], *,
                 waits: TrainerWaits = TrainerWaits()) -> None:
    """The training step's entry point on every rank, for the algorithm `build` makes, with the trial's config as
    the job loaded it (rlkit.jobs.run: loaded once per process); `waits`: its collectives' timeouts (rank 0's at
    least its checkpoint writes' saver.write_timeout)."""
    from rlkit.nameresolve import name_resolve_for

    # first: building the algorithm may take minutes (tokenizing datasets, loading a reference), and a USR1/USR2 that
    # came before the handler would kill the trainer instead of stopping it after its first step
    paths = TrialPaths(Path(trial_dir))
    stop = StopRequests(paths.stop_ack if dist_env_from(os.environ).rank == 0 else None)
    rank0_s = max(waits.rank0_s or 0.0, checkpoint_wait_s(config))
    env, device = init_distributed(name_resolve_for(config), waits.collective_s, rank0_wait_s=rank0_s)
    watch = _rank_watch(config, env)
    watch.start()  # from here a rank that stops is named within recover.rank_silence_timeout
    try:
        with out_of_memory.named(config, None, dict):  # the models are loaded: OutOfMemory
            algorithm = build(LoopContext(config, paths, env, device))
        resumed = _load_resume_point(config, paths, algorithm, announce=env.rank == 0)
    except BaseException:
        watch.stop()
        raise
    Loop(config, paths, algorithm, resumed, rank0=env.rank == 0, stop=stop, watch=watch).run()


def _rank_watch(config: ExperimentConfig, env: DistEnv) -> RankWatch:
    """This rank's heartbeat entry and its watch over the others' (rlkit.trainer.rank_watch), in the trial's name
    resolve with the silence timeout as the entries' lifetime."""
    from rlkit.nameresolve import name_resolve_for

    timeout = config.recover.rank_silence_timeout
    interval = min(5.0, timeout / 4)
    job = JobEnv.from_environ(os.environ)
    run = f"{job.job_id}.{job.step_id}.{job.restart_count}" if job.in_step else f"{env.master_addr}:{env.master_port}"
    return RankWatch(name_resolve_for(config, ttl=timeout, heartbeat_interval=interval), env.rank, env.world_size,
                     run, timeout, heartbeat_interval=interval)


def _load_resume_point(config: ExperimentConfig, paths: TrialPaths, algorithm: Algorithm, *,
                       announce: bool) -> recover.LoopState | None:
    """Collective: the recover checkpoint recover.mode asks for, loaded into every engine (and the RNGs). One whose
    rank file turns out damaged while it loads is skipped as latest_valid skips one (a warning, the previous one);
    with none left, StepError: the engines hold some of the damaged bytes, so the trial cannot start afresh either."""
    damaged: str | None = None
    below: int | None = None
    while True:
        resume = broadcast_object(resume_point(config, paths, below) if announce else None)
        if not isinstance(resume, tuple):
            if damaged is not None:
                raise StepError(f"{damaged}, and no older recover checkpoint is valid; the engines hold part of it, "
                                "so the trial cannot start afresh in this run: remove the damaged checkpoint (or set "
                                "recover.mode=disabled) and resume")
            return None
        step_done, directory = resume
        try:
            return _load_checkpoint(Path(directory), step_done, algorithm, announce=announce)
        except DamagedCheckpoint as exc:
            damaged = f"recover checkpoint {directory} is damaged ({exc})"
            below = step_done
            if announce:
                print(f"rlkit train: WARNING: {damaged}; using an older one", flush=True)


def _load_checkpoint(directory: Path, step_done: int, algorithm: Algorithm, *, announce: bool) -> recover.LoopState:
    state = recover.read_state(directory)  # StepError naming the file: damaged, or of an older rlkit
    recover.check_engines(state, list(algorithm.engines), directory)
    expected = recover.manifest_digests(directory)
    for name, engine in algorithm.engines.items():
        engine.load_sharded(recover.shards_dir(directory, name), state.engines[name], expected)
    try:
        recover.set_rng_state(state.rng)
    except (TypeError, ValueError, RuntimeError) as exc:  # the state's own fields are checked, not the RNGs' insides
        raise StepError(f"{directory / recover.STATE} holds RNG states this rlkit cannot restore ({exc})") from None
    if announce:
        print(f"rlkit train: resuming after step {step_done} from {directory}", flush=True)
    return state


class Loop:
    """The step loop around one algorithm on this rank (`rank0`: this rank keeps metrics, progress, checkpoints)."""

    def __init__(self, config: ExperimentConfig, paths: TrialPaths, algorithm: Algorithm,
                 resumed: recover.LoopState | None, *, rank0: bool, stop: StopRequests,
                 watch: RankWatch | None = None) -> None:
        self.config, self.paths, self.algorithm = config, paths, algorithm
        self.steps = algorithm.total_steps
        self.first_step = resumed.step + 1 if resumed is not None else 1
        self.resumed = resumed
        self.rank0 = rank0
        self.done = self.first_step - 1  # the last finished step
        self.books: LoopRank0 | None = None
        self.stop = stop
        self.watch = watch

    def run(self) -> None:
        algorithm, stop = self.algorithm, self.stop
        try:
            if self.rank0:
                books = self.books = LoopRank0(self.config, self.paths, self.steps,
                                               self.resumed.step if self.resumed is not None else None)
                if self.watch is not None:  # a silent rank is named in progress.json, for `rlkit status`
                    self.watch.on_silent = lambda message: books.progress(self.done, f"failed: {message}",
                                                                          self._fields())
            with out_of_memory.named(self.config, self.first_step, lambda: algorithm.engines):  # its first push
                algorithm.start(self.resumed.algorithm if self.resumed is not None else None)
            if self.books is not None and self.resumed is not None:  # the epochs before the resume were saved then
                self.books.resumed_in_epoch(algorithm.epoch(self.resumed.step))
            for step in range(self.first_step, self.steps + 1):
                with out_of_memory.named(self.config, step, lambda: algorithm.engines):  # OutOfMemory
                    exit_code = self._one_step(step, stop)
                if exit_code is not None:
                    if self.watch is not None:
                        self.watch.finish()
                    self._stop_for(exit_code)
                    broadcast_object(None, rank0_doing="record the stop (progress.json, metrics)")
                    # Every rank exits 0 (a non-zero rank would make srun kill the others); progress.json tells the
                    # batch script whether to requeue the job or to end it.
                    break
            else:
                if self.watch is not None:
                    self.watch.finish()
                if self.books is not None:
                    self.books.progress(self.steps, STATUS_FINISHED, algorithm.progress())
                    self.books.logger.close()
                    algorithm.finish()
        except BaseException as exc:
            out_of_memory.done()  # the record of what ran holds a micro-batch's inputs
            if self.watch is not None:
                self.watch.stop()
            if self.books is not None:
                why = disk_full(exc) or (exc.status if isinstance(exc, OutOfMemory) else type(exc).__name__)
                self.books.progress(self.done, f"failed: {why}", self._fields())
                self.books.logger.close()
                algorithm.abort(exc)
            raise
        finally:
            algorithm.close()
            if dist.is_initialized():
                dist.destroy_process_group()

    def _one_step(self, step: int, stop: StopRequests) -> int | None:
        """Collective: train `step`, record it, checkpoint as due; the exit code to stop with, or None."""
        t0 = time.monotonic()
        try:
            result = self.algorithm.step(step)
        except StepNotStarted as exc:
            raise StepFailed(str(exc), self._save_before_failing(step - 1)) from None
        skipped = skipped_metrics(self.algorithm.engines)  # every rank: each rank's counts start again
        books = self.books
        saves = broadcast_object(books.saves_due(step, self.algorithm.epoch(step)) if books is not None else None)
        assert isinstance(saves, list)
        state = self.algorithm.engines[EXPORTED].full_state_dict() if saves else None  # collective
        if books is not None:
            metrics = {**result.metrics, **skipped, "timing/step": time.monotonic() - t0}
            books.logger.log(step, metrics)
            for name in saves:
                assert state is not None
                books.export(state, name, getattr(self.algorithm, "write_model", None))
            books.progress(step, "running", self.algorithm.progress())
            print(f"rlkit train: step {step}/{self.steps} {self.algorithm.summary(metrics)} "
                  f"step {metrics['timing/step']:.1f}s", flush=True)
        del state
        self.done = step
        # the stop request is read now: a signal that came during the step stops after it
        decision = broadcast_object((*books.checkpoint_decision(step, self.algorithm.epoch(step), stop.requested,
                                                                bool(result.fail)), result.fail)
                                    if books is not None else None, rank0_doing=recording(step, saves))
        assert isinstance(decision, tuple)
        save, exit_code, fail = decision
        if save:
            self._save_recover(step)
        if fault_point("die_after_step", step):  # tests: a crash between checkpoints
            os.kill(os.getpid(), signal.SIGKILL)
        if exit_code == EXIT_FAILING:
            raise StepFailed(fail, self._save_before_failing(step))
        return exit_code

    def _stop_for(self, exit_code: int) -> None:  # rank 0's part
        status = {EXIT_REQUEUE: STATUS_REQUEUE, EXIT_STOPPED: STATUS_STOPPED}[exit_code]
        if self.books is not None:
            self.books.progress(self.done, status, self.algorithm.progress())
            self.books.logger.close()
            print(f"rlkit train: checkpointed and stopping ({status})", flush=True)

    def _fields(self) -> dict[str, Any]:
        try:
            return self.algorithm.progress()
        except Exception:  # failed before the algorithm had anything to report
            return {}

    def _save_recover(self, step: int) -> None:
        """Collective: every engine's shards from every rank into a temp dir; rank 0 adds the loop state, seals,
        prunes."""
        root = recover.recover_root(self.paths.root)
        tmp = recover.temp_dir(root, step)
        if self.books is not None:  # a leftover of a save that failed holds a whole checkpoint
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
        # the others wait in rank 0's group (saver.write_timeout), not the default 30 min; its failure ends them (srun)
        broadcast_object(None, rank0_doing=f"clear {tmp} for the recover checkpoint of step {step}")
        started = time.monotonic()
        digests: dict[str, recover.FileDigest] = {}
        for name, engine in self.algorithm.engines.items():  # checksummed while written, gathered from every rank
            digests.update(engine.save_sharded(recover.shards_dir(tmp, name)))
        dist.barrier()
        if self.books is not None:
            state = recover.LoopState(step=step, engines={n: e.optimizer_steps for n, e in
                                                          self.algorithm.engines.items()},
                                      algorithm=self.algorithm.state(step), rng=recover.rng_state(),
                                      saved_at=time.time())
            self.books.write_recover(tmp, state, started, digests)
        broadcast_object(None, rank0_doing=f"seal the recover checkpoint of step {step} in {root}, prune older ones")

    def _save_before_failing(self, step: int) -> str:
        """Collective: checkpoint the last finished step before a failure that is not the model's (no batch came), so
        the in-job retry or `rlkit resume` loses nothing; returns what to say of it in the failure ("" for nothing)."""
        if step < 1 or self.config.recover.mode == "disabled":
            return ""
        try:
            self._save_recover(step)
        except Exception as exc:  # the failure being reported matters more; say that the checkpoint failed too
            return f"the checkpoint of step {step} failed too: {type(exc).__name__}: {exc}"
        return f"checkpointed step {step}, the trainer's retry resumes from it"
