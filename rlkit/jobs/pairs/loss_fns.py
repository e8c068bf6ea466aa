"""The training-step losses of rw and dpo in the shape the engine takes: a model's forward on one micro-batch, then
the pure loss (rlkit.jobs.pairs.losses), returned as (loss summed over its pairs, number of pairs, detached metrics).
The engine divides by the pairs of the whole minibatch on all ranks (rlkit.jobs.pairs.steps.CountedLoss), so a
rank's share of the gradient does not depend on how the minibatch was split.

Collective rule for DPO's reference: the frozen reference is FSDP-sharded too, so `fill_reference` must run on
every rank for the same micro-batches; decide with an all-reduce over ranks (any rank missing a pair -> all run it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rlkit.config.schema.actor import LOGPROB_CHUNK_TOKENS
from rlkit.jobs.pairs.batch import PairBatch
from rlkit.jobs.pairs.losses import ReferenceLogps, answer_logp_sums, by_pair, dpo_loss, rw_pairwise_loss
from rlkit.models.value_model import last_token_scores, token_values
from rlkit.trainer.head_logprobs import model_token_logprobs

LossOut = tuple[Tensor, int, dict[str, float]]


def _floats(stats: dict[str, Tensor]) -> dict[str, float]:
    return {name: float(value) for name, value in stats.items()}


def rw_loss_fn(model: nn.Module, batch: PairBatch) -> LossOut:
    """Reward model: scores at each sequence's last token, pairwise loss summed over the batch's pairs."""
    scores = last_token_scores(token_values(model, batch.input_ids, batch.attention_mask), batch.last_index)
    loss, stats = rw_pairwise_loss(*by_pair(scores), reduction="sum")
    return loss, batch.n_pairs, _floats(stats)


def answer_logps(model: nn.Module, batch: PairBatch, *, chunk_tokens: int = LOGPROB_CHUNK_TOKENS) -> Tensor:
    """[2B] summed log-probs (temperature 1) of each sequence's answer tokens under a causal LM (its output head
    `chunk_tokens` at a time, 0: full logits)."""
    logp, _ = model_token_logprobs(model, batch.input_ids, batch.attention_mask, chunk_tokens=chunk_tokens)
    return answer_logp_sums(logp, batch.loss_mask)


@torch.no_grad()
def fill_reference(reference: nn.Module, batch: PairBatch, cache: ReferenceLogps, *,
                   chunk_tokens: int = LOGPROB_CHUNK_TOKENS) -> None:
    """Compute the frozen reference's answer log-probs of the batch's pairs into `cache` (collective, see above)."""
    reference.eval()
    cache.put(batch.indices, *by_pair(answer_logps(reference, batch, chunk_tokens=chunk_tokens)))


@dataclass(frozen=True)
class DPOLoss:
    """dpo's loss_fn, bound to the reference cache and the dpo section's knobs."""

    cache: ReferenceLogps
    beta: float
    label_smoothing: float = 0.0
    chunk_tokens: int = LOGPROB_CHUNK_TOKENS  # actor.logprob_chunk_tokens

    def __call__(self, model: nn.Module, batch: PairBatch) -> LossOut:
        ref_chosen, ref_rejected = self.cache.get(batch.indices, batch.input_ids.device)
        chosen, rejected = by_pair(answer_logps(model, batch, chunk_tokens=self.chunk_tokens))
        loss, stats = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=self.beta,
                               label_smoothing=self.label_smoothing, reduction="sum")
        return loss, batch.n_pairs, _floats(stats)
