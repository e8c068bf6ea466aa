"""Job type dpo as an algorithm of the training loop: the actor learns from chosen/rejected pairs against a frozen
reference (dpo.ref_path, else ref.path, else actor.path), in epochs over train_dataset; `run_dpo` is its
`rlkit train` step.

With actor.use_lora the reference is the trained model with its adapter switched off (the frozen base; no second
copy in memory) unless dpo.ref_path or ref.path names another model. The reference's answer log-probs of a pair
are computed the first time the pair is trained on and kept (rlkit.jobs.pairs.losses.ReferenceLogps): later epochs
never run the reference. The reference is FSDP-sharded, so its forwards are collective: when any rank lacks a pair
of its step, every rank runs the reference on all its micro-batches, then the new values are shared, so that every
rank (and rank 0's recover state) holds all of them and a resumed run does not recompute them. At each epoch's end
the held-out pairs of valid_dataset give eval/accuracy (the chosen answer's implicit reward higher) and
eval/reward_margin.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlkit.config.schema.actor import LOGPROB_CHUNK_TOKENS
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.jobs.pairs.batch import pair_share
from rlkit.jobs.pairs.loss_fns import DPOLoss, answer_logps, fill_reference
from rlkit.jobs.pairs.losses import ReferenceLogps, by_pair, dpo_loss
from rlkit.jobs.pairs.steps import CountedLoss, PairData, PairMicroBatch, micro_batches, step_metrics
from rlkit.trainer.dist import all_reduce_max
from rlkit.trainer.engine import TrainEngine, actor_model_factory
from rlkit.trainer.loop import LoopContext, run_training
from rlkit.trainer.offline_epochs import OfflineAlgorithm, WeightedMeans
from rlkit.trainer.reference import adapter_off, reference_model

METRICS = {"loss": "loss", "rewards/margin": "reward_margin", "rewards/accuracy": "accuracy",
           "rewards/chosen": "reward_chosen", "rewards/rejected": "reward_rejected"}


def run_dpo(trial_dir: Path, config: ExperimentConfig) -> None:
    """The dpo trainer step's entry point on every rank (`rlkit train --trial-dir`)."""
    run_training(trial_dir, config, DPOTraining)


def fill_missing(reference: nn.Module, mbs: list[PairMicroBatch], cache: ReferenceLogps, *,
                 chunk_tokens: int = LOGPROB_CHUNK_TOKENS) -> None:
    """Collective: the reference log-probs of every pair of `mbs` that some rank lacks, then shared by all ranks."""
    missing = sorted({i for mb in mbs if not mb.dummy for i in cache.missing(mb.batch.indices)})
    if not all_reduce_max(int(bool(missing))):
        return
    for mb in mbs:  # the same number of reference forwards on every rank
        fill_reference(reference, mb.batch, cache, chunk_tokens=chunk_tokens)
    chosen, rejected = cache.get(missing) if missing else (torch.zeros(0), torch.zeros(0))
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, (missing, chosen.tolist(), rejected.tolist()))
    for indices, chosen_values, rejected_values in every:
        if indices:
            cache.put(indices, torch.tensor(chosen_values, dtype=torch.float64),
                      torch.tensor(rejected_values, dtype=torch.float64))


class DPOTraining(OfflineAlgorithm):
    name = "dpo"

    def __init__(self, ctx: LoopContext) -> None:
        config = ctx.config
        self.data = PairData.load(config, config.dpo, announce=ctx.env.rank == 0)
        super().__init__(ctx, len(self.data.train), has_valid=bool(self.data.valid))
        self.device = ctx.device
        self.engine = TrainEngine(config.actor, rank=self.rank, world=self.world, device=ctx.device,
                                  total_optimizer_steps=self.total_steps,
                                  model_factory=actor_model_factory(config.actor))
        self.engines = {"actor": self.engine}
        self.reference = reference_model(config, ctx.device)  # None: the LoRA base is the reference
        self.cache = ReferenceLogps()  # training pairs, by dataset row
        self.valid_cache = ReferenceLogps()  # held-out pairs (their rows are another file's)

    def train_on(self, rows: list[int], step: int) -> dict[str, float]:
        data, dpo = self.data, self.config.dpo
        mine = pair_share(data.train, rows, self.rank, self.world,
                          algorithm=self.config.actor.mb_spec.packing_algorithm)
        mbs = micro_batches(mine, self.config.actor.mb_spec, data.pad_id, data.train[0], self.device)
        with self._reference() as reference:
            fill_missing(reference, mbs, self.cache, chunk_tokens=self.config.actor.logprob_chunk_tokens)
        loss = CountedLoss(DPOLoss(self.cache, beta=dpo.beta, label_smoothing=dpo.label_smoothing,
                                   chunk_tokens=self.config.actor.logprob_chunk_tokens))
        stats = self.engine.optimizer_step(mbs, loss, len(mine))
        return step_metrics(loss, METRICS, stats)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The implicit rewards of this rank's share of the held-out pairs; accuracy and margin over all of them."""
        data, model, dpo = self.data, self.engine.model, self.config.dpo
        spec = self.config.actor.mb_spec
        mine = pair_share(data.valid, range(len(data.valid)), self.rank, self.world, algorithm=spec.packing_algorithm)
        mbs = micro_batches(mine, spec, data.pad_id, data.valid[0], self.device)
        with self._reference() as reference:
            fill_missing(reference, mbs, self.valid_cache, chunk_tokens=self.config.actor.logprob_chunk_tokens)
        model.eval()
        means = WeightedMeans()
        for mb in mbs:
            batch = mb.batch
            chosen, rejected = by_pair(answer_logps(model, batch, chunk_tokens=self.config.actor.logprob_chunk_tokens))
            ref_chosen, ref_rejected = self.valid_cache.get(batch.indices, self.device)
            _, stats = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=dpo.beta,
                                label_smoothing=dpo.label_smoothing)
            if not mb.dummy:
                means.add({k: float(v) for k, v in stats.items()}, batch.n_pairs)
        keys = ["loss", "rewards/margin", "rewards/accuracy"]
        return {METRICS[k]: v for k, v in means.reduce(keys).items()}

    def _reference(self) -> contextlib.AbstractContextManager[nn.Module]:
        """The frozen reference: its own model, or (LoRA, no other model named) the trained one with its adapter
        off."""
        return contextlib.nullcontext(self.reference) if self.reference is not None else adapter_off(self.engine.model)

    def extra_state(self) -> dict[str, Any]:
        return {"reference": self.cache.state(), "valid_reference": self.valid_cache.state()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.cache = ReferenceLogps.from_state(state.get("reference", {}))
        self.valid_cache = ReferenceLogps.from_state(state.get("valid_reference", {}))
