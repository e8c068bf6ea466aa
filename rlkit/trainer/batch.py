"""Training samples and their packing into padded micro-batch tensors (pure; no model, no distributed).

A sample is a prompt and its completion: one sampled completion, or a multi-turn episode's tokens after the prompt,
of which only the sampled ones (`Sample.loss_mask`) are trained. In a packed micro-batch, per-token tensors have
shape [B, L-1]: position p holds what the model predicts from tokens 0..p for token p+1, so completion token j of a
sample whose prompt has P tokens sits at position P - 1 + j.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

from rlkit.config.schema.actor import MicroBatchSpec
from rlkit.trainer.bins import packed_micro_batches, rank_shares
from rlkit.trainer.sampled_tokens import sampled_mask
from rlkit.types import Sample

T = TypeVar("T")


def _sample_length(sample: Any) -> int:
    return int(sample.length)


@dataclass
class MicroBatch:
    """Right-padded tensors of a few samples."""

    input_ids: Tensor  # [B, L]
    attention_mask: Tensor  # [B, L]
    loss_mask: Tensor  # [B, L-1] bool: sampled completion tokens of real samples (inserted ones never count)
    behav_logp: Tensor  # [B, L-1]
    advantages: Tensor  # [B, L-1]
    n_tokens: int  # sampled completion tokens that count in the loss

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(self.input_ids.to(device), self.attention_mask.to(device), self.loss_mask.to(device),
                          self.behav_logp.to(device), self.advantages.to(device), self.n_tokens)


def pack(samples: Sequence[Sample], pad_id: int, *, mask_truncated: bool = False) -> MicroBatch:
    """Pad `samples` to one [B, L] batch with per-token masks, behaviour log-probs and advantages. The samples'
    per-token lists were checked once, where the batch entered the trainer (advantage_batch.prepare_batch); a
    micro-batch is packed several times a step, so no per-token check here."""
    if not samples:
        raise ValueError("cannot pack an empty micro-batch")
    length = max(s.length for s in samples)
    b = len(samples)
    input_ids = torch.full((b, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, length), dtype=torch.long)
    loss_mask = torch.zeros((b, length - 1), dtype=torch.bool)
    behav = torch.zeros((b, length - 1), dtype=torch.float32)
    adv = torch.zeros((b, length - 1), dtype=torch.float32)
    for i, s in enumerate(samples):
        ids = s.prompt_ids + s.completion_ids
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
        start, end = len(s.prompt_ids) - 1, len(ids) - 1
        sampled = torch.tensor(sampled_mask(s), dtype=torch.bool)
        # An inserted token's behaviour log-prob (0.0) and advantage are zeroed here too: masked out, they must not
        # reach a ratio or a sum even through a loss that forgot the mask.
        behav[i, start:end] = torch.where(sampled, torch.tensor(s.behav_logp, dtype=torch.float32), 0.0)
        if s.token_advantages is not None:
            adv[i, start:end] = torch.where(sampled, torch.tensor(s.token_advantages, dtype=torch.float32), 0.0)
        else:
            adv[i, start:end] = torch.where(sampled, s.advantage, 0.0)
        counts = not s.dummy and not (mask_truncated and not s.finished)  # truncation is per sample (episode)
        loss_mask[i, start:end] = sampled & counts
    return MicroBatch(input_ids, attention_mask, loss_mask, behav, adv, int(loss_mask.sum()))


def split_micro_batches(samples: Sequence[T], *, max_tokens: int | None, min_count: int = 1,
                        length: Callable[[T], int] = _sample_length) -> list[list[T]]:
    """Split into at least `min_count` micro-batches, each at most `max_tokens` padded tokens (B * the longest
    `length`, which counts the tokens an item adds per row: a sample's length, twice a pair's).

    Items keep their order; a single item longer than `max_tokens` gets a micro-batch of its own.
    """
    items = list(samples)
    if not items:
        return []
    count = max(1, min(min_count, len(items)))
    target = -(-len(items) // count)  # at most this many per micro-batch
    out: list[list[T]] = [[]]
    longest = 0
    for i, s in enumerate(items):
        cur = out[-1]
        new_longest = max(longest, length(s))
        too_big = max_tokens is not None and new_longest * (len(cur) + 1) > max_tokens
        needed = len(items) - i <= count - len(out)  # each sample left must open one of the missing micro-batches
        if cur and (too_big or len(cur) >= target or needed):
            out.append([s])
            longest = length(s)
        else:
            cur.append(s)
            longest = new_longest
    return out


def dummy_like(sample: Sample) -> Sample:
    """A copy that takes part in forward/backward but never in the loss (keeps collectives in step)."""
    return Sample(sample.prompt_ids, sample.completion_ids, sample.behav_logp, 0.0, sample.version, True,
                  sample.group, 0.0, dummy=True)


def local_indices(n: int, n_minibatches: int, rank: int, world: int, *, lengths: Sequence[int] | None = None,
                  algorithm: str = "ffd") -> list[list[int]]:
    """Per minibatch, the indices of a global batch of `n` samples this rank trains on.

    Minibatch k is every n_minibatches-th sample from k, the same whatever the number of ranks. Its samples are
    dealt over the ranks by tokens when their `lengths` are given (rlkit.trainer.bins.rank_shares: every rank within
    a few percent of the mean), else every world-th.
    """
    minibatches = [list(range(k, n, n_minibatches)) for k in range(n_minibatches)]
    if lengths is None:
        return [mb[rank::world] for mb in minibatches]
    return [[mb[j] for j in rank_shares([lengths[i] for i in mb], world, algorithm=algorithm)[rank]]
            for mb in minibatches]


def micro_batch_groups(items: Sequence[T], spec: MicroBatchSpec, *,
                       length: Callable[[T], int] = _sample_length) -> list[list[T]]:
    """This rank's items in micro-batches as `spec` says: packed ones balanced by real tokens (rlkit.trainer.bins;
    `length`: the tokens an item adds), or with `packing` off today's padded split (split_micro_batches)."""
    if not spec.packing:
        return split_micro_batches(items, max_tokens=spec.max_tokens_per_mb, min_count=spec.n_mbs, length=length)
    bins = packed_micro_batches([length(x) for x in items], max_tokens=spec.max_tokens_per_mb, n_mbs=spec.n_mbs,
                                divisor=spec.n_mbs_divisor, algorithm=spec.packing_algorithm)
    return [[items[i] for i in b] for b in bins]


def common_count(local: int, spec: MicroBatchSpec) -> int:
    """Collective: the micro-batch count every rank runs (the largest of any rank, rounded up to n_mbs_divisor when
    packing); a rank with fewer runs dummies."""
    from rlkit.trainer.dist import all_reduce_max

    count = all_reduce_max(local)
    step = spec.n_mbs_divisor if spec.packing else 1
    return -(-count // step) * step
