"""Preference pairs packed into padded tensors: both sequences of a pair side by side, chosen first.

Row 2i is pair i's chosen sequence and row 2i+1 its rejected one (the layout AReaL's and Trinity-RFT's pair
losses read), right-padded. Per-token tensors follow rlkit.trainer.batch: position p holds what the model predicts
from tokens 0..p for token p+1, so `loss_mask` [2B, L-1] marks the positions that predict an answer token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlkit.config.schema.actor import MicroBatchSpec
from rlkit.jobs.pairs.data import Pair
from rlkit.trainer.batch import micro_batch_groups, split_micro_batches
from rlkit.trainer.bins import rank_shares


@dataclass
class PairBatch:
    """Right-padded tensors of a few pairs (2 rows per pair)."""

    input_ids: Tensor  # [2B, L]
    attention_mask: Tensor  # [2B, L]
    loss_mask: Tensor  # [2B, L-1] bool: positions that predict an answer token
    last_index: Tensor  # [2B] position of each sequence's last token (where a reward model's score is read)
    indices: list[int]  # the pairs' dataset row indices (the reference log-prob cache's keys)

    @property
    def n_pairs(self) -> int:
        return len(self.indices)

    def to(self, device: torch.device) -> PairBatch:
        return PairBatch(self.input_ids.to(device), self.attention_mask.to(device), self.loss_mask.to(device),
                         self.last_index.to(device), self.indices)


def pack_pairs(pairs: Sequence[Pair], pad_id: int) -> PairBatch:
    """Pad `pairs` into one PairBatch (chosen, rejected, chosen, rejected, ...)."""
    if not pairs:
        raise ValueError("cannot pack an empty list of pairs")
    sequences = [pair.sequence(side) for pair in pairs for side in ("chosen", "rejected")]
    length = max(len(ids) for ids, _ in sequences)
    rows = len(sequences)
    input_ids = torch.full((rows, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, length), dtype=torch.long)
    loss_mask = torch.zeros((rows, length - 1), dtype=torch.bool)
    for row, (ids, answer) in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
        loss_mask[row, : len(ids) - 1] = torch.tensor(answer[1:], dtype=torch.bool)
    last_index = attention_mask.sum(dim=1) - 1
    return PairBatch(input_ids, attention_mask, loss_mask, last_index, [pair.index for pair in pairs])


def split_pairs(pairs: Sequence[Pair], *, max_tokens: int | None, min_count: int = 1,
                spec: MicroBatchSpec | None = None) -> list[list[Pair]]:
    """At least `min_count` micro-batches (fewer when there are fewer pairs) of consecutive pairs, each at most
    `max_tokens` padded tokens (2 x pairs x longest sequence); a pair larger than that gets one of its own. With a
    packing `spec`: its micro-batches of whole pairs, balanced by real tokens (rlkit.trainer.batch.micro_batch_groups;
    its max_tokens_per_mb and n_mbs then replace the arguments)."""
    if spec is not None and spec.packing:
        return micro_batch_groups(pairs, spec, length=pair_tokens)
    return split_micro_batches(pairs, max_tokens=max_tokens, min_count=min_count, length=lambda p: 2 * p.length)


def pair_tokens(pair: Pair) -> int:
    """The real tokens a pair adds to a packed micro-batch: its chosen and rejected sequences."""
    return sum(len(pair.sequence(side)[0]) for side in ("chosen", "rejected"))


def pair_share(pairs: Sequence[Pair], rows: Sequence[int], rank: int, world: int, *, algorithm: str = "ffd"
               ) -> list[Pair]:
    """This rank's pairs of a step's `rows`, the rows dealt over the ranks by tokens (rlkit.trainer.bins)."""
    share = rank_shares([pair_tokens(pairs[i]) for i in rows], world, algorithm=algorithm)[rank]
    return [pairs[rows[j]] for j in share]
