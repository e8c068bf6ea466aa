"""What rw and dpo share on top of rlkit.trainer.offline_epochs: the pairs of train_dataset and valid_dataset, a
rank's pairs as micro-batches (the same count on every rank, padding ones counting for nothing), and the engine's
loss adapter for the loss functions of rlkit.jobs.pairs.loss_fns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from rlkit.config.schema.actor import MicroBatchSpec
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.schema.pairs import PairDataConfig
from rlkit.jobs.pairs.batch import PairBatch, pack_pairs, split_pairs
from rlkit.jobs.pairs.data import Pair, pairs_from_config
from rlkit.trainer.offline_epochs import WeightedMeans, check_same_data, data_digest, same_count

PairLossFn = Callable[[nn.Module, PairBatch], tuple[Tensor, int, dict[str, float]]]


@dataclass
class PairData:
    """The tokenized pairs of a pair job: training pairs (by position: the epoch schedule's rows) and held-out ones."""

    train: list[Pair]
    valid: list[Pair]
    pad_id: int

    @classmethod
    def load(cls, config: ExperimentConfig, section: PairDataConfig, *, announce: bool) -> PairData:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path or config.actor.path)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        train, counts = pairs_from_config(config.train_dataset, section, tokenizer)
        valid = pairs_from_config(config.valid_dataset, section, tokenizer)[0] if config.valid_dataset.path else []
        where = " or ".join(p for p in (config.train_dataset.path, config.valid_dataset.path) if p)
        check_same_data(data_digest([*train, "|", *valid]), where)
        if announce:
            print(f"rlkit train: {counts.kept} training pairs ({counts.truncated} prompts cut, {len(counts.dropped)} "
                  f"rows dropped), {len(valid)} validation pairs", flush=True)
        return cls(train, valid, int(pad_id))


@dataclass(frozen=True)
class PairMicroBatch:
    """A packed micro-batch; `dummy`: padding that only keeps this rank's forwards in step with the others."""

    batch: PairBatch
    dummy: bool = False


def micro_batches(pairs: Sequence[Pair], spec: MicroBatchSpec, pad_id: int, filler: Pair,
                  device: torch.device) -> list[PairMicroBatch]:
    """Collective: this rank's `pairs` in micro-batches (mb_spec), padded with dummies of `filler` to the largest
    count of any rank."""
    real = [PairMicroBatch(pack_pairs(part, pad_id).to(device))
            for part in split_pairs(pairs, max_tokens=spec.max_tokens_per_mb, min_count=spec.n_mbs, spec=spec)]
    padded, _ = same_count(real, PairMicroBatch(pack_pairs([filler], pad_id).to(device), dummy=True),
                           divisor=spec.n_mbs_divisor if spec.packing else 1)
    return padded


class CountedLoss:
    """The engine's loss_fn for a pair loss function: (mean over the micro-batch's pairs, pairs), zero for a
    dummy; keeps the metrics weighted by pairs."""

    def __init__(self, fn: PairLossFn) -> None:
        self.fn = fn
        self.means = WeightedMeans()

    def __call__(self, model: nn.Module, mb: PairMicroBatch) -> tuple[Tensor, int]:
        loss, units, stats = self.fn(model, mb.batch)
        if mb.dummy:
            return loss * 0.0, 0
        self.means.add(stats, units)
        return loss / max(1, units), units


def local_pairs(pairs: Sequence[Pair], rows: Sequence[int]) -> list[Pair]:
    return [pairs[i] for i in rows]


def rename(stats: dict[str, float], names: dict[str, str]) -> dict[str, float]:
    """Metrics under the names the job type logs (unlisted ones dropped)."""
    return {new: stats[old] for old, new in names.items() if old in stats}


def step_metrics(loss: CountedLoss, names: dict[str, str], engine_stats: dict[str, Any]) -> dict[str, float]:
    """Collective: the loss metrics averaged over every rank's pairs, plus grad norm and LR."""
    return {**rename(loss.means.reduce(list(names)), names), "grad_norm": float(engine_stats["grad_norm"]),
            "lr": float(engine_stats["lr"])}
