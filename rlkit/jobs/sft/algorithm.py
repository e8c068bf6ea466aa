"""Supervised fine-tuning as an algorithm of the training loop (rlkit.trainer.loop); `run_sft` is the `sft` job's step.

Trainer only (no servers). Every rank tokenizes the whole training (and validation) set itself: the split of a batch
into each rank's micro-batches depends on every row's length (rlkit.jobs.sft.data.rank_micro_batches), and knowing
them all lets each rank derive every other rank's share without a collective; the dataset must therefore be readable
from every node, like actor.path already is. A digest of the tokenized rows is compared across ranks once, so a rank
that read different data fails the start instead of training on a silently different batch.

Batches are a permutation fixed by (seed, epoch), so a step number alone says which rows it trains: a resumed run
continues at the next batch of its epoch, and the recover checkpoint's state records that position to check it.
Validation (`eval/*`) runs at the end of every epoch and after the last step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.schema.sft import sft_row_limit
from rlkit.errors import StepError
from rlkit.jobs.sft.data import SFTExample, load_sft_dataset, rank_micro_batches
from rlkit.jobs.sft.loss import SUMS, SFTMicroBatch, collate, eval_nll, sft_loss_fn, sft_metrics
from rlkit.trainer.dist import all_reduce_sum
from rlkit.trainer.engine import TrainEngine, actor_model_factory
from rlkit.trainer.loop import LoopContext, StepResult, run_training
from rlkit.trainer.offline_epochs import EpochSchedule, check_same_data, data_digest


def run_sft(trial_dir: Path, config: ExperimentConfig) -> None:
    """The sft trainer step's entry point on every rank."""
    run_training(trial_dir, config, SFT)


class SFT:
    """The sft algorithm on one rank (the loop's `Algorithm`)."""

    def __init__(self, ctx: LoopContext) -> None:
        """Collective: tokenizer and datasets (every rank), the number of steps, the actor engine."""
        from transformers import AutoTokenizer

        config = self.config = ctx.config
        self.paths = ctx.paths
        self.rank, self.world, self.device = ctx.env.rank, ctx.env.world_size, ctx.device
        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path or config.actor.path)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        train_ds, valid_ds = config.train_dataset, config.valid_dataset
        budget = config.actor.mb_spec.max_tokens_per_mb
        self.train = load_sft_dataset(train_ds.path, tokenizer, config.sft,
                                      max_length=sft_row_limit(train_ds.max_length, budget))
        self.valid = (load_sft_dataset(valid_ds.path, tokenizer, config.sft,
                                       max_length=sft_row_limit(valid_ds.max_length, budget))
                      if valid_ds.path else None)
        valid_rows = self.valid.examples if self.valid is not None else []
        check_same_data(data_digest([*((e.input_ids, e.loss_mask) for e in self.train.examples), "|",
                                     *((e.input_ids, e.loss_mask) for e in valid_rows)]),
                        f"{train_ds.path} or the validation set")
        self.rows = len(self.train.examples)
        self.schedule = EpochSchedule.of(config, self.rows)  # the same batches as rw and dpo take
        self.per_epoch = self.schedule.steps_per_epoch
        self.total_steps = self.schedule.total_steps
        if self.total_steps <= 0:
            raise StepError(f"no training steps: {self.rows} usable rows in {train_ds.path} (dropped by max_length: "
                            f"{self.train.dropped}), train_dataset.batch_size {train_ds.batch_size}")
        self.engine = TrainEngine(config.actor, rank=self.rank, world=self.world, device=self.device,
                                  total_optimizer_steps=self.total_steps,
                                  model_factory=actor_model_factory(config.actor))  # peft-wrapped with use_lora
        self.engines: dict[str, TrainEngine] = {"actor": self.engine}
        self.last: dict[str, float] = {}  # rank 0: the latest metrics, for progress.json
        self.last_eval: dict[str, float] = {}
        if self.rank == 0:
            self._describe()

    def _describe(self) -> None:
        t, v = self.train, self.valid
        print(f"rlkit train: sft on {len(t.examples)} rows ({t.dropped} dropped, {t.truncated} truncated by max_length"
              f"), {self.per_epoch} steps per epoch, {self.total_steps} steps; validation: "
              + (f"{len(v.examples)} rows ({v.dropped} dropped)" if v is not None else "none"), flush=True)

    def _micro_batches(self, examples: list[SFTExample], batch: list[int]) -> tuple[list[SFTMicroBatch], int, int]:
        """This rank's micro-batches of `batch` (packed in the forward unless mb_spec.packing is off; dummies
        appended so every rank runs as many), its target tokens and its dummies."""
        spec = self.config.actor.mb_spec
        rank, world = self.engine.data_rank_world  # under sequence parallelism, the sp group's share
        mbs, n_dummies = rank_micro_batches(batch, [e.length for e in examples], rank=rank, world=world,
                                            max_tokens=spec.max_tokens_per_mb, n_mbs=spec.n_mbs, spec=spec)
        micro = [collate([examples[i] for i in mb], self.pad_id).to(self.device) for mb in mbs]
        if n_dummies:
            dummy = collate([examples[batch[0]]], self.pad_id, dummy=True).to(self.device)
            micro += [dummy] * n_dummies
        return micro, sum(examples[i].n_targets for mb in mbs for i in mb), n_dummies

    def start(self, resumed: dict[str, Any] | None) -> None:
        """Resuming: the checkpoint must come from the same data layout, or its step numbers mean other rows."""
        if resumed is None:
            return
        saved = (resumed.get("rows"), resumed.get("steps_per_epoch"))
        if saved != (self.rows, self.per_epoch):
            raise StepError(f"the recover checkpoint was written for {saved[0]} rows ({saved[1]} steps per epoch), "
                            f"but the training set now gives {self.rows} ({self.per_epoch}): the data or "
                            "train_dataset.batch_size/max_length changed; submit a new trial (or --force)")
        self.last_eval = dict(resumed.get("eval") or {})

    def step(self, step: int) -> StepResult:
        """Collective: one optimizer step over the step's batch; validation at an epoch's end and after the last."""
        micro, local_tokens, dummies = self._micro_batches(self.train.examples, self.schedule.rows(step))
        sums = dict.fromkeys(SUMS, 0.0)  # this rank's

        def loss_fn(model: Any, mb: SFTMicroBatch) -> tuple[Any, int]:
            nll_sum, n_tokens, stats = sft_loss_fn(model, mb, chunk_tokens=self.config.actor.logprob_chunk_tokens)
            for key in SUMS:
                sums[key] += stats[key]
            return nll_sum / max(1, n_tokens), n_tokens  # the engine weighs a mean by its units

        stats = self.engine.optimizer_step(micro, loss_fn, local_tokens)
        *reduced, dummies_all = all_reduce_sum([*sums.values(), float(dummies)])
        metrics = {**sft_metrics(dict(zip(SUMS, reduced, strict=True)), prefix="sft"),
                   "sft/grad_norm": stats["grad_norm"],
                   "sft/lr": stats["lr"], "sft/epoch": float((step - 1) // self.per_epoch + 1),
                   "sft/dummy_micro_batches": dummies_all}  # forward/backward passes spent keeping ranks in step
        if self.schedule.ends_epoch(step):
            self.last_eval = self.evaluate()
            metrics.update(self.last_eval)
        if self.rank != 0:
            return StepResult()
        self.last = metrics
        return StepResult(metrics)

    def evaluate(self) -> dict[str, float]:
        """Collective: the token-mean NLL of the whole validation set over every rank (eval/loss) and AReaL's
        perplexity, its mean over sequences (eval/ppl); {} without one."""
        if self.valid is None or not self.valid.examples:
            return {}
        examples = self.valid.examples
        micro, _, _ = self._micro_batches(examples, list(range(len(examples))))
        self.engine.model.eval()
        try:
            chunk = self.config.actor.logprob_chunk_tokens
            parts = [eval_nll(self.engine.model, mb, chunk_tokens=chunk) for mb in micro]
        finally:
            self.engine.model.train()
        reduced = all_reduce_sum([sum(p[key] for p in parts) for key in SUMS])
        return sft_metrics(dict(zip(SUMS, reduced, strict=True)), prefix="eval")

    def epoch(self, step: int) -> int:
        """Whole epochs done after `step` (the savers' freq_epochs)."""
        return self.schedule.epochs_done(step)

    def state(self, step: int) -> dict[str, Any]:
        """The data position after `step` (the next batch), the layout it assumes, and the last validation."""
        epoch, index = divmod(step, self.per_epoch)
        return {"epoch": epoch, "next_batch": index, "rows": self.rows, "steps_per_epoch": self.per_epoch,
                "eval": self.last_eval}

    def progress(self) -> dict[str, Any]:
        """sft's fields of progress.json (`rlkit status`)."""
        return {"epoch": self.last.get("sft/epoch"), "epochs": self.config.total_train_epochs,
                "loss": self.last.get("sft/loss"), "eval_loss": self.last_eval.get("eval/loss")}

    def summary(self, metrics: dict[str, float]) -> str:
        line = f"epoch {int(metrics['sft/epoch'])} loss {metrics['sft/loss']:.4f} ({int(metrics['sft/tokens'])} tokens)"
        return line + (f" eval/loss {metrics['eval/loss']:.4f}" if "eval/loss" in metrics else "")

    def finish(self) -> None:
        print(f"rlkit train: done; metrics in {self.paths.metrics}, final model in {self.paths.checkpoints / 'final'}",
              flush=True)

    def abort(self, exc: BaseException) -> None:
        """Nothing of sft's own to report: the loop records the failure."""

    def close(self) -> None:
        """No servers, threads or transports to release."""
