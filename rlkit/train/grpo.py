"""The asynchronous GRPO loop run by every trainer rank (`rlkit train`).

Rank 0 owns the rollout controller, the weight sync to the servers and the metrics (rlkit.train.grpo_rank0); all
ranks train their shard of each batch with FSDP. One step: take a batch of groups (at most max_head_offpolicyness
versions old) -> advantages -> recompute log-probs (and reference log-probs) -> ppo_n_minibatches optimizer steps
-> the full weights, gathered in buckets, go to every server through the weight transport (actor.weight_update_mode,
rlkit.weights) -> every server reports the new version and passes the fingerprint check (rlkit.weights.fanout) ->
metrics, progress and (per saver) a Hugging Face checkpoint.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from rlkit.config.load import load_config
from rlkit.config.schema import ExperimentConfig
from rlkit.data import load_rows, prompt_token_ids
from rlkit.errors import StepError
from rlkit.paths import TrialPaths
from rlkit.rollout.controller import Prompt
from rlkit.train import recover
from rlkit.train.advantage_batch import token_advantages
from rlkit.train.batch import Sample
from rlkit.train.dist import broadcast_object, gather_per_sample, init_distributed
from rlkit.train.engine import PolicyEngine
from rlkit.train.fault_corrupt import FAULT, corrupt_server
from rlkit.train.faults import failed_before, fault_point
from rlkit.train.grpo_rank0 import EXIT_REQUEUE, EXIT_SERVERS_GONE, EXIT_STOPPED, Rank0
from rlkit.train.mismatch_step import mismatch_temperature, step_mismatch
from rlkit.weights.base import WeightTransport, transport_for

PROBE_TEXT = " The answer is 42, and 7 + 5 = 12."


def total_steps(config: ExperimentConfig, n_rows: int) -> int:
    """Training steps: the epochs over the data (last partial batch dropped), capped by total_train_steps."""
    per_epoch = n_rows // config.train_dataset.batch_size
    steps = per_epoch * config.total_train_epochs
    if config.total_train_steps is not None:
        steps = min(steps, config.total_train_steps) if steps else config.total_train_steps
    return steps


def load_prompts(config: ExperimentConfig, tokenizer: Any) -> list[Prompt]:
    """The training prompts, tokenized; rows longer than train_dataset.max_length are dropped."""
    ds = config.train_dataset
    rows = load_rows(ds.path)
    if rows and ds.prompt_key not in rows[0]:
        raise StepError(f"dataset {ds.path} has no column '{ds.prompt_key}' (columns: {', '.join(rows[0])}); "
                        f"set train_dataset.prompt_key")
    prompts = []
    for i, row in enumerate(rows):
        ids = prompt_token_ids(row[ds.prompt_key], tokenizer, chat_template=False)
        if ds.max_length is not None and len(ids) > ds.max_length:
            continue
        text = row[ds.prompt_key] if isinstance(row[ds.prompt_key], str) else tokenizer.decode(ids)
        prompts.append(Prompt(i, row, text, ids))
    return prompts


def run_grpo(trial_dir: Path) -> None:
    """The training step's entry point on every rank."""
    from transformers import AutoTokenizer

    paths = TrialPaths(Path(trial_dir))
    config = load_config(paths.config)
    from rlkit.nameresolve import name_resolve_for

    env, device = init_distributed(name_resolve_for(config))
    rank0 = env.rank == 0
    actor = config.actor
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path or actor.path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)

    prompts = load_prompts(config, tokenizer) if rank0 else []
    steps = broadcast_object(total_steps(config, len(prompts)) if rank0 else 0)
    assert isinstance(steps, int)
    if steps <= 0:
        raise StepError(f"no training steps: {len(prompts)} prompts, batch_size {config.train_dataset.batch_size}")
    engine = PolicyEngine(actor, rank=env.rank, world=env.world_size, device=device, pad_id=pad_id,
                          temperature=config.gconfig.temperature, total_optimizer_steps=steps * actor.ppo_n_minibatches)
    probe = broadcast_object((prompts[0].ids + tokenizer.encode(PROBE_TEXT, add_special_tokens=False))
                             if rank0 else None)
    assert isinstance(probe, list)
    resume = broadcast_object(_resume_point(config, paths) if rank0 else None)
    state0: recover.TrainerState | None = None
    if isinstance(resume, tuple):
        step_done, directory = resume
        state0 = recover.TrainerState.from_json((Path(directory) / recover.STATE).read_text())
        engine.load_sharded(Path(directory) / recover.SHARDS, state0.optimizer_steps)
        recover.set_rng_state(state0.rng)
        if rank0:
            print(f"rlkit train: resuming after step {step_done} from {directory}", flush=True)
    first_step = state0.step + 1 if state0 is not None else 1
    mismatch_t = mismatch_temperature(config, announce=rank0)
    if os.environ.get("RLKIT_FAULT_INJECT") == "die_at_start":  # tests: a trainer that can never make progress
        raise StepError("fault injected: die_at_start")
    transport = transport_for(actor.weight_update_mode)(config, paths)  # every rank: pushes are collective
    trainer = Rank0(config, paths, tokenizer, prompts, steps, state0) if rank0 else None
    stop = _StopRequests()
    try:
        if trainer is not None:
            trainer.start(transport)
        if state0 is not None:  # fresh servers hold actor.path: give them the resumed weights before any request
            _check_weights(engine, trainer, transport, probe, version=state0.version, push=True)
        else:
            _check_weights(engine, trainer, transport, probe, version=0, push=False)
        if trainer is not None:
            trainer.controller.end_update(trainer.version)
        for step in range(first_step, steps + 1):
            t0 = time.monotonic()
            batch = trainer.next_batch() if trainer is not None else None
            shared = broadcast_object(batch)
            if isinstance(shared, str):  # no batch (every server gone, or rank 0 failed): all ranks stop
                raise StepError(shared + _save_before_failing(engine, trainer, step - 1, paths, config))
            samples: list[Sample] = shared  # type: ignore[assignment]
            t_got = time.monotonic()
            if samples:
                old = engine.logprobs_at(samples) if actor.recompute_logprob else None
                t_check = time.monotonic()
                if mismatch_t is not None:  # samples of version step - 1 were generated with the weights held now
                    per_server = step_mismatch(engine, samples, old, version=step - 1, temperature=mismatch_t)
                    if trainer is not None and per_server is not None:
                        trainer.note_mismatch(per_server, step - 1)
                t_check = time.monotonic() - t_check
                ref = engine.logprobs_at(samples, reference=True) if engine.ref is not None else None
                kl_reward = actor.kl_ctl > 0  # issue 17: the KL reward penalty needs the whole batch's old/ref
                adv_stats = token_advantages(samples, gather_per_sample(old) if kl_reward else None,
                                             gather_per_sample(ref) if kl_reward else None, actor)
                train_stats = engine.train_step(samples, old, ref)
                train_stats.update({f"actor/{k}": v for k, v in adv_stats.items()})
            else:
                train_stats, t_check = {}, 0.0
            t_trained = time.monotonic()
            if fault_point(FAULT, step):  # tests (every rank): server 1 silently serves other weights as `step`
                noisy_from = engine.full_state_dict()  # collective
                if trainer is not None:
                    trainer.controller.before_admit = lambda v, t=trainer, s=noisy_from: corrupt_server(t, s, v)
            _check_weights(engine, trainer, transport, probe, version=step, push=True, tolerate_all_gone=True)
            t_synced = time.monotonic()
            saves = broadcast_object(trainer.saves_due(step) if trainer is not None else None)
            assert isinstance(saves, list)
            state = engine.full_state_dict() if saves else None  # collective; only for a saver checkpoint
            if trainer is not None:
                gathered = transport.timings.get("gather", 0.0)
                trainer.finish_step(step, state, saves, train_stats, timing={
                    "timing/generate_wait": t_got - t0, "timing/train": t_trained - t_got,
                    "timing/logprob_mismatch": t_check,
                    "timing/gather_weights": gathered, "timing/weight_sync": t_synced - t_trained - gathered,
                    "timing/step": time.monotonic() - t0})
            del state
            decision = broadcast_object(trainer.checkpoint_decision(step, stop.requested) if trainer else None)
            assert isinstance(decision, tuple)
            save, exit_code = decision
            if save:
                _save_recover(engine, trainer, step, paths)
            if fault_point("die_after_step", step):  # tests: a crash between checkpoints
                os.kill(os.getpid(), signal.SIGKILL)
            if exit_code == EXIT_SERVERS_GONE:
                saved = _save_before_failing(engine, trainer, step, paths, config)
                if trainer is not None:
                    trainer.stop_for(exit_code)
                raise StepError("every inference server is unreachable" + saved)
            if exit_code is not None:
                if trainer is not None:
                    trainer.stop_for(exit_code)
                dist.barrier()
                # Every rank exits 0 (a non-zero rank would make srun kill the others); progress.json tells the
                # batch script whether to requeue the job or to end it.
                break
        else:
            if trainer is not None:
                trainer.finish()
    except BaseException as exc:
        if trainer is not None:
            trainer.abort(exc)
        raise
    finally:
        transport.close()
        if dist.is_initialized():
            dist.destroy_process_group()


class _StopRequests:
    """USR1 (Slurm's time-limit warning) and USR2 (`rlkit stop`) ask for a checkpoint and an exit after this step."""

    def __init__(self) -> None:
        self.requested: int | None = None
        signal.signal(signal.SIGUSR1, self._handler)
        signal.signal(signal.SIGUSR2, self._handler)

    def _handler(self, signum: int, _frame: object) -> None:
        self.requested = EXIT_REQUEUE if signum == signal.SIGUSR1 else EXIT_STOPPED
        print(f"rlkit train: got {signal.Signals(signum).name}: checkpoint after this step, then exit", flush=True)


def _resume_point(config: ExperimentConfig, paths: TrialPaths) -> tuple[int, str] | None:
    """Rank 0: the checkpoint to resume from, by recover.mode; StepError for mode resume with none."""
    mode = config.recover.mode
    if mode == "disabled" or (mode == "fault" and not failed_before()):
        return None  # before checksumming anything: nothing would be resumed
    found = recover.latest_valid(recover.recover_root(paths.root))
    if mode == "resume" and found is None:
        raise StepError(f"recover.mode is resume but {recover.recover_root(paths.root)} holds no valid checkpoint")
    return (found[0], str(found[1])) if found is not None else None


def _save_recover(engine: PolicyEngine, trainer: Rank0 | None, step: int, paths: TrialPaths) -> None:
    """Collective: shards from every rank into a temp dir; rank 0 adds the trainer state, seals, prunes."""
    root = recover.recover_root(paths.root)
    tmp = recover.temp_dir(root, step)
    if trainer is not None:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    started = time.monotonic()
    digests = engine.save_sharded(tmp / recover.SHARDS)  # checksummed while written, gathered from every rank
    dist.barrier()
    if trainer is not None:
        trainer.write_recover(tmp, step, engine.optimizer_steps, started, digests)
    dist.barrier()


def _save_before_failing(engine: PolicyEngine, trainer: Rank0 | None, step: int, paths: TrialPaths,
                         config: ExperimentConfig) -> str:
    """Collective: checkpoint the last finished step before a failure that is not the model's (no batch came), so
    the in-job retry or `rlkit resume` loses nothing; returns what to add to the failure message."""
    if step < 1 or config.recover.mode == "disabled":
        return ""
    try:
        _save_recover(engine, trainer, step, paths)
    except Exception as exc:  # the failure being reported matters more; say that the checkpoint failed too
        return f"; the checkpoint of step {step} failed too: {type(exc).__name__}: {exc}"
    return f"; checkpointed step {step}, the trainer's retry resumes from it"


def _check_weights(engine: PolicyEngine, trainer: Rank0 | None, transport: WeightTransport, probe: list[int], *,
                   version: int, push: bool, tolerate_all_gone: bool = False) -> None:
    """Collective: the trainer's probe log-probs; with `push`, every rank runs the model's full weights through
    `transport` (rank 0 delivers them to every server as `version`); rank 0 checks every server's fingerprint.

    With `tolerate_all_gone`, rank 0 notes a push that found no reachable server (trainer.servers_gone) instead of
    raising, so that all ranks can checkpoint the step together before failing."""
    from rlkit.servers.http import ServerUnreachable
    from rlkit.weights import fanout

    trainer_lp = engine.probe_logprobs(probe)
    buckets = engine.iter_full_buckets(transport.bucket_bytes, transport.bucket_dtype()) if push else None
    if trainer is None:
        if buckets is not None:
            fanout.publish(transport, buckets, version, None, None)
        return
    try:
        if buckets is not None:
            trainer.publish(transport, buckets, version, probe, trainer_lp)
        else:
            trainer.verify(probe, trainer_lp)
    except ServerUnreachable as exc:
        if not tolerate_all_gone:
            raise
        trainer.servers_gone = str(exc)
        print(f"rlkit train: {exc}", flush=True)
