"""Epochs over a fixed dataset, for the trainer-only algorithms of the training loop (sft, rw, dpo).

What such an algorithm shares: which rows each step trains on (a seeded order per epoch, so the data position after
any step follows from the step alone and a resumed run takes exactly the rows the interrupted one would have taken),
each rank's share of a step's rows, the same number of micro-batches on every rank (FSDP's forwards are collective),
the same data on every rank, the data position in the recover state, and a validation pass at each epoch's end
(and after the last step). `OfflineAlgorithm` implements the loop's `Algorithm` protocol around two hooks:
`train_on(rows, step)` and `evaluate()`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch.distributed as dist

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.data.files import epoch_order
from rlkit.errors import StepError
from rlkit.trainer.dist import all_reduce_max, all_reduce_sum
from rlkit.trainer.engine import TrainEngine
from rlkit.trainer.loop import LoopContext, StepResult

T = TypeVar("T")


@dataclass
class EpochSchedule:
    """The rows of every step: `batch_size` rows per step, the last partial batch of an epoch dropped (as GRPO
    does), `epochs` passes capped at `max_steps` steps. With `shuffle`, each epoch's order is a permutation drawn
    from (seed, epoch) alone."""

    n_items: int
    batch_size: int
    epochs: int
    max_steps: int | None = None
    seed: int = 0
    shuffle: bool = True
    _orders: dict[int, list[int]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, config: ExperimentConfig, n_items: int) -> EpochSchedule:
        ds = config.train_dataset
        return cls(n_items, ds.batch_size, config.total_train_epochs, config.total_train_steps, config.seed,
                   ds.shuffle)

    @property
    def steps_per_epoch(self) -> int:
        return self.n_items // max(1, self.batch_size)

    @property
    def total_steps(self) -> int:
        steps = self.steps_per_epoch * self.epochs
        return min(steps, self.max_steps) if self.max_steps is not None else steps

    def order(self, epoch: int) -> list[int]:
        """Row indices in the order of epoch `epoch` (0-based)."""
        if epoch not in self._orders:  # one epoch at a time is all a run reads
            self._orders = {epoch: epoch_order(self.n_items, epoch, self.seed, self.shuffle)}
        return self._orders[epoch]

    def rows(self, step: int) -> list[int]:
        """The row indices step `step` (1-based) trains on."""
        epoch, k = divmod(step - 1, self.steps_per_epoch)
        return self.order(epoch)[k * self.batch_size: (k + 1) * self.batch_size]

    def epochs_done(self, step: int) -> int:
        """Whole passes over the data after `step` (the savers' freq_epochs count these)."""
        return step // self.steps_per_epoch

    def ends_epoch(self, step: int) -> bool:
        """Whether `step` is the last of an epoch (or of the run)."""
        return step % self.steps_per_epoch == 0 or step == self.total_steps

    def position(self, step: int) -> dict[str, int]:
        """The data position after `step`, as the recover state keeps it."""
        return {"epoch": self.epochs_done(step), "rows_into_epoch": (step % self.steps_per_epoch) * self.batch_size,
                "n_items": self.n_items, "batch_size": self.batch_size, "seed": self.seed}

    def check_resumed(self, saved: dict[str, int]) -> None:
        """StepError when the run resumed has other data than the one checkpointed (its position would be wrong)."""
        for key, now in (("n_items", self.n_items), ("batch_size", self.batch_size), ("seed", self.seed)):
            if saved.get(key) != now:
                raise StepError(f"the recover checkpoint was written with {key}={saved.get(key)}, this run has "
                                f"{key}={now}: the dataset or its settings changed since; resume with the same "
                                "ones, or start a new trial")


def rank_share(rows: Sequence[T], rank: int, world: int) -> list[T]:
    """This rank's part of a step's rows (every world-th, so shares differ by at most one row)."""
    return list(rows[rank::world])


def data_digest(items: Iterable[object]) -> str:
    """A short hash of tokenized rows (their reprs, in order): equal on ranks that read the same data."""
    h = hashlib.blake2b(digest_size=16)
    for item in items:
        h.update(repr(item).encode())
    return h.hexdigest()


def check_same_data(digest: str, what: str) -> None:
    """Collective: StepError on every rank when the ranks' digests differ (a node read another file: each rank
    derives the others' shares from its own copy, so they must agree)."""
    digests: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest)
    if len(set(digests)) > 1:
        raise StepError(f"the ranks tokenized different data ({what} differs between nodes): every rank must read "
                        "the same files")


def same_count(parts: list[T], dummy: T, *, divisor: int = 1) -> tuple[list[T], int]:
    """Collective: `parts` padded with `dummy` to the largest count of any rank (rounded up to a multiple of
    `divisor`), and how many are real."""
    count = -(-all_reduce_max(len(parts)) // divisor) * divisor
    return parts + [dummy] * (count - len(parts)), len(parts)


class WeightedMeans:
    """Metrics averaged over units (pairs, tokens) of every rank: add per-part means with their unit counts,
    then `reduce` (collective) gives the global means."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.units = 0.0

    def add(self, means: dict[str, float], units: float) -> None:
        for key, value in means.items():
            self.sums[key] = self.sums.get(key, 0.0) + value * units
        self.units += units

    def reduce(self, keys: Sequence[str]) -> dict[str, float]:
        """Collective (every rank passes the same `keys`): {key: mean over all ranks' units}."""
        totals = all_reduce_sum([self.sums.get(k, 0.0) for k in keys] + [self.units])
        units = max(1.0, totals[-1])
        return {k: v / units for k, v in zip(keys, totals[:-1], strict=True)}


class OfflineAlgorithm:
    """An `Algorithm` of the loop over a fixed dataset in epochs. Subclasses set `name` (the metric prefix) and
    `engines`, call `__init__` with the number of training rows, and implement the collective hooks `train_on`
    and `evaluate`; `extra_state`/`load_extra_state` carry what else a resume needs."""

    name = "offline"

    def __init__(self, ctx: LoopContext, n_items: int, *, has_valid: bool) -> None:
        self.config, self.rank, self.world = ctx.config, ctx.env.rank, ctx.env.world_size
        self.rank0 = self.rank == 0
        self.schedule = EpochSchedule.of(ctx.config, n_items)
        self.total_steps = self.schedule.total_steps
        if self.total_steps <= 0:
            raise StepError(f"no training steps: {n_items} rows, train_dataset.batch_size "
                            f"{self.schedule.batch_size}, total_train_epochs {self.schedule.epochs}")
        self.has_valid = has_valid
        self.engines: dict[str, TrainEngine] = {}
        self.last_eval: dict[str, float] = {}
        self.last_step = 0

    def train_on(self, rows: list[int], step: int) -> dict[str, float]:
        """Collective: one optimizer step on the step's `rows` (the same on every rank: each takes its share, e.g.
        `rank_share`); the metrics (over every rank's rows) without the job's prefix."""
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        """Collective: metrics on the validation set (without the "eval/" prefix)."""
        raise NotImplementedError

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Every rank: what `extra_state` kept."""

    # the loop's Algorithm protocol
    def start(self, resumed: dict[str, Any] | None) -> None:
        if resumed is not None:
            self.schedule.check_resumed(resumed["data"])
            self.last_eval = dict(resumed.get("last_eval", {}))
            self.load_extra_state(resumed)

    def step(self, step: int) -> StepResult:
        metrics = {f"{self.name}/{k}": v for k, v in self.train_on(self.schedule.rows(step), step).items()}
        if self.has_valid and self.schedule.ends_epoch(step):
            self.last_eval = self.evaluate()
            metrics.update({f"eval/{k}": v for k, v in self.last_eval.items()})
        self.last_step = step
        metrics["epoch"] = float(self.schedule.epochs_done(step))
        return StepResult(metrics if self.rank0 else {})

    def epoch(self, step: int) -> int:
        return self.schedule.epochs_done(step)

    def state(self, step: int) -> dict[str, Any]:
        return {"data": self.schedule.position(step), "last_eval": self.last_eval, **self.extra_state()}

    def progress(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"epoch": self.schedule.epochs_done(self.last_step),
                                  "total_epochs": self.schedule.epochs}
        if self.last_eval:
            fields["eval"] = self.last_eval
        return fields

    def summary(self, metrics: dict[str, float]) -> str:
        text = f"loss {metrics.get(f'{self.name}/loss', float('nan')):.4f}"
        if "eval/accuracy" in metrics:
            text += f" eval accuracy {metrics['eval/accuracy']:.3f}"
        return text

    def finish(self) -> None:
        pass

    def abort(self, exc: BaseException) -> None:
        pass

    def close(self) -> None:
        pass
