"""Asynchronous GRPO as an algorithm of the training loop (rlkit.trainer.loop); `run_grpo` is the `rlkit train` step.

Rank 0 owns the rollout controller, the weight sync to the servers and the metrics (rlkit.jobs.grpo.rank0); all
ranks train their shard of each batch with FSDP (rlkit.trainer.actor). One step: take a batch of groups (at most
max_head_offpolicyness versions old) -> sequence rewards shaped and normalised (rank 0) -> recompute log-probs (and
reference log-probs) -> per-token advantages (KL reward penalty, GAE, adv_norm; rlkit.trainer.rl_math.advantage_batch)
-> ppo_n_minibatches optimizer steps -> the full weights, gathered in buckets, go to every server through the weight
transport (actor.weight_update_mode, rlkit.weights; with actor.use_lora the adapter only, rlkit.weights.lora_disk)
-> every server reports the new version and passes the
fingerprint check (rlkit.weights.fanout). The loop then logs, saves and checkpoints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rlkit.config.reference import reference_load
from rlkit.config.schema.actor import ActorConfig, optimizer_steps_per_step, recomputes_logprobs
from rlkit.config.schema.evaluation import evaluation_enabled
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.data.row_formats import rl_prompt
from rlkit.errors import StepError
from rlkit.jobs.grpo.expert import ExpertRows
from rlkit.jobs.grpo.fault_corrupt import FAULT, corrupt_server
from rlkit.jobs.grpo.rank0 import Rank0
from rlkit.jobs.grpo.waits import trainer_waits
from rlkit.jobs.prompt_rows import prompt_rows, row_prompt_ids
from rlkit.rollout.groups import Prompt
from rlkit.rollout.sync_schedule import schedule_for
from rlkit.slurm.faults import fault_point
from rlkit.trainer.actor import PPOActor
from rlkit.trainer.dist import broadcast_object, gather_per_sample
from rlkit.trainer.engine import TrainEngine
from rlkit.trainer.loop import LoopContext, StepNotStarted, StepResult, run_training
from rlkit.trainer.mismatch_step import mismatch_temperature, step_mismatch
from rlkit.trainer.rl_math.advantage_batch import token_advantages
from rlkit.trainer.rl_math.kl_controller import KLController
from rlkit.trainer.sft_mix import ExpertBatch
from rlkit.types import Sample
from rlkit.weights.base import Buckets, WeightTransport, transport_for_actor

T = TypeVar("T")

PROBE_TEXT = " The answer is 42, and 7 + 5 = 12."


def total_steps(config: ExperimentConfig, n_rows: int) -> int:
    """Training steps: the epochs over the data (last partial batch dropped), capped by total_train_steps."""
    per_epoch = n_rows // config.train_dataset.batch_size
    steps = per_epoch * config.total_train_epochs
    if config.total_train_steps is not None:
        steps = min(steps, config.total_train_steps) if steps else config.total_train_steps
    return steps


def load_prompts(config: ExperimentConfig, tokenizer: Any, name: str = "train_dataset") -> list[Prompt]:
    """The prompts of dataset `name` (train_dataset or valid_dataset), tokenized with each row's tools (its
    tools_key); rows longer than its max_length are dropped."""
    ds = getattr(config, name)
    rows = prompt_rows(config, ds, field=name, valid=name == "valid_dataset", log=f"rlkit train: {name}:")
    prompts = []
    for i, row in enumerate(rows):
        prompt = rl_prompt(row, ds.prompt_key)  # GSM8K's rows as AReaL reads them (rlkit.data.row_formats)
        ids = row_prompt_ids(row, i, prompt, tokenizer, ds, field=name, chat_template=False,  # the row's tools too
                             episodes=bool(config.rollout.agent.workflow))
        if ds.max_length is not None and len(ids) > ds.max_length:
            continue
        text = prompt if isinstance(prompt, str) else tokenizer.decode(ids)
        prompts.append(Prompt(i, row, text, ids))
    return prompts


def set_token_advantages(actor: ActorConfig, samples: list[Sample], old: dict[int, list[float]] | None,
                         ref: dict[int, list[float]] | None, control: KLController) -> dict[str, float]:
    """Every sample's per-token advantages (KL reward penalty of `control`'s coefficient, GAE, adv_norm), the same
    on every rank; then `control` updates for the next step (on every rank alike: the KL statistic is the whole
    batch's). Returns the statistics as step metrics. Collective when kl_ctl > 0: the penalty needs the whole batch's
    old and reference log-probs, of which each rank computed its share (`old`, `ref`: global index -> log-probs)."""
    kl_reward = actor.kl_ctl > 0
    stats = token_advantages(samples, gather_per_sample(old) if kl_reward else None,
                             gather_per_sample(ref) if kl_reward else None, actor, kl_ctl=control.value)
    stats.update(control.step_done(stats, len(samples)))
    return {f"actor/{k}": v for k, v in stats.items()}


def run_grpo(trial_dir: Path, config: ExperimentConfig) -> None:
    """The GRPO trainer step's entry point on every rank (`rlkit train --trial-dir`)."""
    run_training(trial_dir, config, GRPO, waits=trainer_waits(config))


class GRPO:
    """The GRPO algorithm on one rank (the loop's `Algorithm`): rank 0 also holds the rollouts (`trainer`).
    `rank0_class`: what rank 0 runs (job type distill adds the teacher's scores to each batch)."""

    rank0_class: type[Rank0] = Rank0
    # whether train_batch reads the proximal log-probs before the update whatever the config (distill's advantages):
    # then the step never leaves them to the update's own forward (PPOActor.reuses_training_logprobs)
    reads_old_first = False

    def __init__(self, ctx: LoopContext) -> None:
        """Collective: tokenizer, prompts (rank 0), the number of steps, the actor, the fingerprint probe."""
        from transformers import AutoTokenizer

        config = self.config = ctx.config
        self.paths = ctx.paths
        self.rank0 = ctx.env.rank == 0
        actor = config.actor
        self.tokenizer = tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path or actor.path)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        self.prompts = prompts = load_prompts(config, tokenizer) if self.rank0 else []
        steps = broadcast_object(total_steps(config, len(prompts)) if self.rank0 else 0)
        assert isinstance(steps, int)
        if steps <= 0:
            raise StepError(f"no training steps: {len(prompts)} prompts, batch_size {config.train_dataset.batch_size}")
        self.total_steps = steps
        self.actor = PPOActor.build(actor, rank=ctx.env.rank, world=ctx.env.world_size, device=ctx.device,
                                    pad_id=pad_id, temperature=config.gconfig.temperature,
                                    total_optimizer_steps=steps * optimizer_steps_per_step(actor),
                                    ref=reference_load(config), max_new_tokens=config.gconfig.max_new_tokens)
        self.engines: dict[str, TrainEngine] = {"actor": self.actor.engine}
        probe = broadcast_object((prompts[0].ids + tokenizer.encode(PROBE_TEXT, add_special_tokens=False))
                                 if self.rank0 else None)
        assert isinstance(probe, list)
        self.probe: list[int] = probe
        if self.rank0 and self.skips_recompute():
            print("rlkit train: the log-probs' forward is skipped: one optimizer step per batch "
                  "(actor.ppo_n_minibatches 1, ppo_epochs 1), no KL reward penalty (kl_ctl 0) and no dropout in the "
                  "trained model, so each micro-batch's training forward gives the proximal log-probs (ratio 1) and "
                  "the step's log-prob mismatch check reads them", flush=True)
        self.trainer: Rank0 | None = None
        self.transport: WeightTransport | None = None
        self.mismatch_t: float | None = None
        self.schedule = schedule_for(actor)
        self.expert = ExpertRows(config, tokenizer) if config.expert_dataset.path else None  # SFT+RL mix
        self.expert_batch: ExpertBatch | None = None
        self.kl_control = KLController(actor)  # the KL reward penalty's coefficient: state, saved and resumed
        if self.expert is not None and self.rank0:
            print(f"rlkit train: SFT+RL mix: {len(self.expert.samples)} expert rows ({self.expert.dropped} over "
                  f"max_length), {self.expert.batch_size} per step, mu {self.expert.mu:g}", flush=True)

    def start(self, resumed: dict[str, Any] | None) -> None:
        """Collective: the servers are checked (resuming: first given the resumed weights), rollouts may begin."""
        config = self.config
        if resumed is not None:
            self.resume_kl_control(resumed)
        self.mismatch_t = mismatch_temperature(config, announce=self.rank0)
        self.transport = transport = transport_for_actor(config.actor)(config, self.paths)  # every rank
        if self.rank0:
            self.trainer = self.rank0_class(config, self.paths, self.tokenizer, self.prompts, self.total_steps, resumed)
        trainer = self.trainer
        rank0_alone(lambda: trainer.start(transport) if trainer is not None else None)  # the servers registering
        if resumed is not None:  # fresh servers hold actor.path: give them the resumed weights before any request
            _check_weights(self.actor.engine, self.trainer, transport, self.probe, version=int(resumed["version"]),
                           push=True)
        else:
            _check_weights(self.actor.engine, self.trainer, transport, self.probe, version=0, push=False)
        if self.trainer is not None:
            self.trainer.controller.end_update(self.trainer.version)
            if evaluation_enabled(config.evaluator):
                self.trainer.attach_evaluator(load_prompts(config, self.tokenizer, "valid_dataset"),
                                              on_startup=config.evaluator.eval_on_startup and resumed is None)

    def step(self, step: int) -> StepResult:
        """Collective: a batch (rank 0, broadcast), its log-probs, the PPO steps and, when the schedule says so
        (actor.weight_update_interval), the push of the next weight version."""
        trainer, transport, actor, schedule = self.trainer, self.transport, self.actor, self.schedule
        assert transport is not None
        t0 = time.monotonic()
        batch = trainer.next_batch() if trainer is not None else None
        shared = broadcast_object(batch)
        if isinstance(shared, str):  # no batch (every server gone, or rank 0 failed): all ranks stop
            raise StepNotStarted(shared)
        samples: list[Sample] = shared  # type: ignore[assignment]
        self.expert_batch = self.expert.batch(step) if self.expert is not None else None
        t_got = time.monotonic()
        if samples:
            # no forward pass when the decoupled loss approximates its proximal policy (prox_logp_method loglinear),
            # nor when the update's own forward gives the same numbers (one optimizer step: skips_recompute)
            skip = self.skips_recompute()
            old = actor.logprobs_at(samples) if recomputes_logprobs(actor.config) and not skip else None
            t_check = time.monotonic()
            # the servers hold the trainer's weights only when the previous step pushed them (or none was trained):
            # samples of that version were then generated with the weights held now
            checked = self.mismatch_t is not None and (step == 1 or schedule.pushes_at(step - 1))
            # skipped at the temperature the check compares at: it reads the training forward's log-probs, after it
            after = checked and skip and self.mismatch_t == actor.temperature
            if checked and not after:
                self._mismatch(samples, old, step)
            t_check = time.monotonic() - t_check
            ref = actor.logprobs_at(samples, reference=True) if actor.has_reference else None
            actor.current_version = schedule.pushes_after(step - 1)  # what the trained weights are as a version
            train_stats = self.train_batch(samples, old, ref)
            if after:
                t_after = time.monotonic()
                assert actor.training_logp is not None
                self._mismatch(samples, actor.training_logp, step)
                t_check += time.monotonic() - t_after
        else:
            train_stats, t_check = {}, 0.0
        t_trained = time.monotonic()
        if fault_point(FAULT, step):  # tests (every rank): server 1 silently serves other weights as `step`
            noisy_from = actor.engine.full_state_dict()  # collective
            if trainer is not None:
                trainer.controller.before_admit = lambda v, t=trainer, s=noisy_from: corrupt_server(t, s, v)
        pushed = schedule.pushes_at(step)
        if pushed:
            _check_weights(actor.engine, trainer, transport, self.probe, version=schedule.pushes_after(step),
                           push=True, tolerate_all_gone=True)
        if trainer is None:
            return StepResult()
        trainer.pushed = pushed
        gathered = transport.timings.get("gather", 0.0) if pushed else 0.0
        metrics = trainer.step_metrics(step, train_stats, timing={
            "timing/generate_wait": t_got - t0, "timing/train": t_trained - t_got, "timing/logprob_mismatch": t_check,
            "timing/gather_weights": gathered, "timing/weight_sync": time.monotonic() - t_trained - gathered})
        # no server took the push: the loop checkpoints this step and fails (the in-job retry resumes)
        return StepResult(metrics, fail="every inference server is unreachable" if trainer.servers_gone else "")

    def skips_recompute(self) -> bool:
        """Whether this step leaves the proximal log-probs to the update's own forward (PPOActor's
        reuses_training_logprobs, rlkit.config.schema.actor) instead of a forward pass before it."""
        return self.actor.reuses_training_logprobs and not self.reads_old_first

    def _mismatch(self, samples: list[Sample], trainer_logp: dict[int, list[float]] | None, step: int) -> None:
        """Collective: the log-prob mismatch check of the samples of the version the trainer held before this
        step's update, on `trainer_logp` (that version's log-probs of this rank's samples) when given."""
        assert self.mismatch_t is not None
        version = self.schedule.pushes_after(step - 1)
        per_server = step_mismatch(self.actor, samples, trainer_logp, version=version, temperature=self.mismatch_t)
        if self.trainer is not None and per_server is not None:
            self.trainer.note_mismatch(per_server, version)

    def train_batch(self, samples: list[Sample], old: dict[int, list[float]] | None,
                    ref: dict[int, list[float]] | None) -> dict[str, float]:
        """Collective: the batch's advantages, then the actor's PPO steps; returns their metrics. The hook job type
        ppo overrides to add its critic (rlkit.jobs.ppo.algorithm)."""
        adv_stats = set_token_advantages(self.actor.config, samples, old, ref, self.kl_control)
        train_stats = self.actor.train_step(samples, old, ref, expert=self.expert_batch)
        train_stats.update(adv_stats)
        return train_stats

    def epoch(self, step: int) -> int:
        assert self.trainer is not None
        return self.trainer.epoch(step)

    def state(self, step: int) -> dict[str, Any]:
        assert self.trainer is not None
        return {**self.trainer.state(step), **self.kl_control.state()}

    def resume_kl_control(self, resumed: dict[str, Any]) -> None:
        """Every rank: the KL penalty's coefficient continues from the checkpoint's (the adaptive controller's)."""
        try:
            said = self.kl_control.restore(resumed)
        except ValueError as exc:
            raise StepError(f"the recover checkpoint's trainer state cannot be resumed: {exc}; it was altered after "
                            "it was written: remove that checkpoint to resume from the one before it (or set "
                            "recover.mode=disabled)") from None
        if said and self.rank0:
            print(f"rlkit train: {said}", flush=True)

    def progress(self) -> dict[str, Any]:
        return self.trainer.progress() if self.trainer is not None else {}

    def summary(self, metrics: dict[str, float]) -> str:
        assert self.trainer is not None
        return self.trainer.summary(metrics)

    def finish(self) -> None:
        if self.trainer is not None:
            self.trainer.finish()

    def abort(self, exc: BaseException) -> None:
        if self.trainer is not None:
            self.trainer.abort(exc)

    def close(self) -> None:
        if self.trainer is not None:
            self.trainer.close()
        if self.transport is not None:
            self.transport.close()


def rank0_alone(work: Callable[[], T]) -> T:
    """Collective: `work` (rank 0's alone: the others' does nothing), then rank 0 says it is done, or why it failed,
    through its broadcast group (rlkit.trainer.dist.broadcast_object), so the other ranks wait for it there, as long
    as its deadlines add up to (rlkit.jobs.grpo.waits), not in the next collective, whose timeout is shorter (the
    servers registering take rollout.setup_timeout, an evaluation before a push rollout.request_timeout). Off rank
    0, rank 0's failure is raised as a StepError naming it."""
    try:
        result = work()
    except BaseException as exc:
        broadcast_object(f"trainer rank 0 failed: {type(exc).__name__}: {exc}")
        raise
    failed = broadcast_object("")
    if failed:
        raise StepError(str(failed))
    return result


def _buckets(engine: TrainEngine, transport: WeightTransport) -> Buckets:
    """What `transport` pushes, as a collective iterator: the LoRA adapter only (lora_disk), or the full weights."""
    if transport.adapters_only:
        from rlkit.trainer.lora import iter_adapter_buckets

        return iter_adapter_buckets(engine.model, transport.bucket_dtype())
    return engine.iter_full_buckets(transport.bucket_bytes, transport.bucket_dtype())


def _check_weights(engine: TrainEngine, trainer: Rank0 | None, transport: WeightTransport, probe: list[int], *,
                   version: int, push: bool, tolerate_all_gone: bool = False) -> None:
    """Collective: the trainer's probe log-probs; with `push`, rank 0 waits alone for what comes before a push
    (Rank0.before_push: a running evaluation, a live server; `rank0_alone`), then every rank runs the model's weights
    (the adapter only with LoRA) through `transport` (rank 0 delivers them to every server as `version`); rank 0
    checks every server's fingerprint (through the new adapter with LoRA: the probe request names it).

    With `tolerate_all_gone`, rank 0 notes a push that found no reachable server (trainer.servers_gone) instead of
    raising, so that all ranks can checkpoint the step together before failing."""
    from rlkit.servers.http import ServerUnreachable
    from rlkit.weights import fanout

    trainer_lp = engine.probe_logprobs(probe)
    servers = rank0_alone(lambda: trainer.before_push(version) if trainer is not None else None) if push else None
    buckets = _buckets(engine, transport) if push else None
    if trainer is None:
        if buckets is not None:
            fanout.publish(transport, buckets, version, None, None)
        return
    try:
        if buckets is not None:
            assert servers is not None
            trainer.publish(transport, buckets, version, probe, trainer_lp, servers)
        else:
            trainer.verify(probe, trainer_lp)
    except ServerUnreachable as exc:
        if not tolerate_all_gone:
            raise
        trainer.servers_gone = str(exc)
        print(f"rlkit train: {exc}", flush=True)
