"""The expert rows of an SFT+RL mix (expert_dataset, mix.mu; rlkit.trainer.sft_mix): read on every rank in the `sft`
section's row format, and the same expert_dataset.batch_size rows for a step on every rank (a seeded order per pass,
so a resumed run takes the rows it would have taken)."""

from __future__ import annotations

import random
from typing import Any

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import StepError
from rlkit.trainer.sft_mix import ExpertBatch
from rlkit.types import Sample


def expert_sample(input_ids: list[int], loss_mask: list[int]) -> Sample:
    """An SFT example as a Sample: the tokens before the first target are the prompt, the rest the completion with
    its targets as the loss mask (a multi-turn chat's inserted turns are not targets)."""
    first = next((i for i, m in enumerate(loss_mask) if i > 0 and m), len(input_ids))
    completion = input_ids[first:]
    return Sample(prompt_ids=input_ids[:first], completion_ids=completion, behav_logp=[0.0] * len(completion),
                  reward=0.0, version=0, finished=True, group=-1, loss_mask=list(loss_mask[first:]))


class ExpertRows:
    """expert_dataset's rows as Samples, and each step's batch of them."""

    def __init__(self, config: ExperimentConfig, tokenizer: Any) -> None:
        from rlkit.jobs.sft.data import load_sft_dataset

        ds = config.expert_dataset
        loaded = load_sft_dataset(ds.path, tokenizer, config.sft, max_length=ds.max_length)
        self.samples = [expert_sample(e.input_ids, e.loss_mask) for e in loaded.examples
                        if e.n_targets > 0]
        if len(self.samples) < ds.batch_size:
            raise StepError(f"expert_dataset {ds.path}: {len(self.samples)} usable rows ({loaded.dropped} over "
                            f"max_length), fewer than expert_dataset.batch_size {ds.batch_size}")
        self.batch_size, self.shuffle, self.seed, self.mu = ds.batch_size, ds.shuffle, config.seed, config.mix.mu
        self.dropped = loaded.dropped

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.samples)))
        if self.shuffle:
            random.Random(self.seed * 7919 + epoch).shuffle(order)
        return order

    def batch(self, step: int) -> ExpertBatch:
        """Step `step`'s rows (1-based steps; the last partial batch of a pass is skipped)."""
        per_pass = len(self.samples) // self.batch_size
        epoch, index = divmod(step - 1, per_pass)
        order = self._order(epoch)[index * self.batch_size:(index + 1) * self.batch_size]
        return ExpertBatch([self.samples[i] for i in order], self.mu)
