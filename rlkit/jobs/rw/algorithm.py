"""Job type rw as an algorithm of the training loop: a reward model (a scalar head on the actor's backbone,
rlkit.models.value_model) trained on chosen/rejected pairs with the pairwise loss, in epochs over train_dataset;
`run_rw` is its `rlkit train` step.

Each step: this rank's share of the step's pairs, in micro-batches, one optimizer step of -log sigmoid(r_chosen -
r_rejected) averaged over every rank's pairs. At each epoch's end the held-out pairs of valid_dataset are scored:
eval/accuracy (chosen scored higher) and eval/reward_margin. The saver writes a reward model that reloads with its
head (rlkit.trainer.value_model.save_value_model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.jobs.pairs.batch import pair_share
from rlkit.jobs.pairs.loss_fns import rw_loss_fn
from rlkit.jobs.pairs.losses import by_pair, rw_pairwise_loss
from rlkit.jobs.pairs.steps import CountedLoss, PairData, micro_batches, step_metrics
from rlkit.models.dtypes import DTYPES
from rlkit.models.value_model import last_token_scores, token_values
from rlkit.trainer.engine import TrainEngine, value_head_model
from rlkit.trainer.loop import LoopContext, run_training
from rlkit.trainer.offline_epochs import OfflineAlgorithm, WeightedMeans
from rlkit.trainer.value_model import save_value_model

METRICS = {"loss": "loss", "accuracy": "accuracy", "margin": "reward_margin", "chosen_score": "chosen_score",
           "rejected_score": "rejected_score"}


def run_rw(trial_dir: Path, config: ExperimentConfig) -> None:
    """The rw trainer step's entry point on every rank (`rlkit train --trial-dir`)."""
    run_training(trial_dir, config, RewardModelTraining)


class RewardModelTraining(OfflineAlgorithm):
    name = "rw"

    def __init__(self, ctx: LoopContext) -> None:
        config = ctx.config
        self.data = PairData.load(config, config.rw, announce=ctx.env.rank == 0)
        super().__init__(ctx, len(self.data.train), has_valid=bool(self.data.valid))
        self.device = ctx.device
        self.engine = TrainEngine(config.actor, rank=self.rank, world=self.world, device=ctx.device,
                                  total_optimizer_steps=self.total_steps, model_factory=value_head_model)
        self.engines = {"actor": self.engine}

    def train_on(self, rows: list[int], step: int) -> dict[str, float]:
        data = self.data
        mine = pair_share(data.train, rows, self.rank, self.world,
                          algorithm=self.config.actor.mb_spec.packing_algorithm)
        mbs = micro_batches(mine, self.config.actor.mb_spec, data.pad_id, data.train[0], self.device)
        loss = CountedLoss(rw_loss_fn)
        stats = self.engine.optimizer_step(mbs, loss, len(mine))
        return step_metrics(loss, METRICS, stats)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Score this rank's share of the held-out pairs; accuracy and margin over all of them."""
        data, model = self.data, self.engine.model
        model.eval()
        means = WeightedMeans()
        pairs = pair_share(data.valid, range(len(data.valid)), self.rank, self.world,
                           algorithm=self.config.actor.mb_spec.packing_algorithm)
        for mb in micro_batches(pairs, self.config.actor.mb_spec, data.pad_id, data.valid[0], self.device):
            batch = mb.batch
            scores = last_token_scores(token_values(model, batch.input_ids, batch.attention_mask), batch.last_index)
            _, stats = rw_pairwise_loss(*by_pair(scores))
            if not mb.dummy:
                means.add({k: float(v) for k, v in stats.items()}, batch.n_pairs)
        return {METRICS[k]: v for k, v in means.reduce(["loss", "accuracy", "margin"]).items()}

    def write_model(self, state: dict[str, Any], out_dir: Path) -> None:
        """The saver's export (rank 0): a reward model directory that reloads with its head."""
        save_value_model(state, self.engine.model.config, self.config.actor.path, out_dir, kind="reward",
                         dtype=DTYPES[self.config.actor.dtype], tokenizer_dir=self.config.tokenizer_path)
