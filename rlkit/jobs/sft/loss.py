"""The SFT loss: negative log-likelihood of the target tokens, as a sum with its token count (pure torch).

A sum, not a mean: the engine divides by the token count of the whole minibatch over every micro-batch and rank,
so each target token weighs the same however the rows were split (2 ranks train like 1). The metrics are made
from the all-reduced sums the same way (`SUMS`): `loss` is the token mean of the NLL, `ppl` AReaL's perplexity, the
mean over sequences of exp(that sequence's token-mean NLL) (areal/trainer/sft/lm_engine.py), not exp(loss).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlkit.config.schema.actor import LOGPROB_CHUNK_TOKENS
from rlkit.jobs.sft.data import SFTExample
from rlkit.trainer.head_logprobs import model_token_logprobs

SUMS = ("nll_sum", "tokens", "ppl_sum", "seqs")  # what the loss functions return, summed over micro-batches and ranks
_MAX_NLL = 700.0  # exp() of more overflows a float


@dataclass
class SFTMicroBatch:
    """Right-padded tensors of a few examples; per-token tensors are [B, L-1], aligned with the next token."""

    input_ids: Tensor  # [B, L]
    attention_mask: Tensor  # [B, L]
    loss_mask: Tensor  # [B, L-1] bool: position p is trained when token p+1 is a target
    n_tokens: int  # target tokens in this micro-batch (0 for a dummy that only keeps the ranks in step)

    def to(self, device: torch.device) -> SFTMicroBatch:
        return SFTMicroBatch(self.input_ids.to(device), self.attention_mask.to(device), self.loss_mask.to(device),
                             self.n_tokens)


def collate(examples: Sequence[SFTExample], pad_id: int, *, dummy: bool = False) -> SFTMicroBatch:
    """Pad `examples` into one micro-batch. `dummy`: the same shapes with an all-false loss mask (a rank with no rows
    left still runs forward/backward so FSDP's collectives stay in step, and adds nothing)."""
    if not examples:
        raise ValueError("cannot collate an empty micro-batch")
    length = max(e.length for e in examples)
    if length < 2:
        raise ValueError("an SFT example needs at least two tokens (a context and a target)")
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), length - 1), dtype=torch.bool)
    for row, e in enumerate(examples):
        input_ids[row, : e.length] = torch.tensor(e.input_ids, dtype=torch.long)
        attention_mask[row, : e.length] = 1
        if not dummy:
            loss_mask[row, : e.length - 1] = torch.tensor(e.loss_mask[1:], dtype=torch.bool)
    return SFTMicroBatch(input_ids, attention_mask, loss_mask, int(loss_mask.sum()))


def sft_nll(logp: Tensor, loss_mask: Tensor) -> tuple[Tensor, int]:
    """(sum of -logp over the masked tokens, their count): divide by the global count to get the mean loss."""
    mask = loss_mask.bool()
    return -torch.where(mask, logp, torch.zeros_like(logp)).sum(), int(mask.sum())


def sequence_ppl(logp: Tensor, loss_mask: Tensor) -> tuple[float, int]:
    """(sum over the rows with a target of exp(the row's token-mean NLL), those rows): AReaL's `ppl` is their mean,
    so each sequence weighs the same whatever its length. Rows without a target (dummies) take no part."""
    mask = loss_mask.bool()
    counts = mask.sum(dim=-1)
    nll = -torch.where(mask, logp.detach().double(), 0.0).sum(dim=-1)
    rows = counts > 0
    per_row = (nll[rows] / counts[rows]).clamp(max=_MAX_NLL).exp()
    return float(per_row.sum()), int(rows.sum())


def sft_loss_fn(model: torch.nn.Module, mb: SFTMicroBatch, *, chunk_tokens: int = LOGPROB_CHUNK_TOKENS
                ) -> tuple[Tensor, int, dict[str, float]]:
    """The training loop's loss function for sft: forward `mb` (the output head `chunk_tokens` at a time, 0: full
    logits), return (NLL sum, target tokens, the `SUMS` to sum over micro-batches and ranks). The sum is
    differentiable; for a dummy micro-batch it is a zero that still depends on every parameter, so backward runs the
    same collectives on every rank."""
    logp, _ = model_token_logprobs(model, mb.input_ids, mb.attention_mask, chunk_tokens=chunk_tokens)
    loss_sum, n_tokens = sft_nll(logp, mb.loss_mask)
    ppl_sum, seqs = sequence_ppl(logp, mb.loss_mask)
    return loss_sum, n_tokens, {"nll_sum": float(loss_sum.detach()), "tokens": float(n_tokens),
                                "ppl_sum": ppl_sum, "seqs": float(seqs)}


@torch.no_grad()
def eval_nll(model: torch.nn.Module, mb: SFTMicroBatch, *, chunk_tokens: int = LOGPROB_CHUNK_TOKENS
             ) -> dict[str, float]:
    """The `SUMS` of one validation micro-batch, without gradients; all-reduce, then sft_metrics."""
    return sft_loss_fn(model, mb, chunk_tokens=chunk_tokens)[2]


def sft_metrics(sums: Mapping[str, float], *, prefix: str = "sft") -> dict[str, float]:
    """Token-mean loss, AReaL's perplexity (`ppl`: the mean over sequences of exp(per-sequence NLL)) and the token
    count, from the `SUMS` over every micro-batch and rank (prefix: sft or eval)."""
    tokens, seqs = sums["tokens"], sums["seqs"]
    return {f"{prefix}/loss": sums["nll_sum"] / tokens if tokens else float("nan"),
            f"{prefix}/ppl": sums["ppl_sum"] / seqs if seqs else float("nan"), f"{prefix}/tokens": float(tokens)}
