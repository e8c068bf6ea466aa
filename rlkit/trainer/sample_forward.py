"""Forward passes over samples in micro-batches that every rank runs the same number of (any algorithm that trains on
or scores `Sample`s: the PPO actor's log-probs and steps, a reference model's log-probs).

Collective: a rank with fewer micro-batches than the others runs dummy ones (a copy of a real sample that counts for
nothing) so that FSDP's all-gathers stay in step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from rlkit.config.schema.actor import MicroBatchSpec
from rlkit.trainer.batch import MicroBatch, common_count, dummy_like, micro_batch_groups, pack
from rlkit.trainer.engine import TrainEngine, token_logprobs
from rlkit.trainer.sampled_tokens import sampled_count
from rlkit.types import Sample


def micro_batches_idx(sub: Sequence[Sample], idx: list[int], mb_spec: MicroBatchSpec) -> list[list[int]]:
    """Micro-batches of sample indices (-1: a dummy), the same count on every rank; collective."""
    pos = {id(s): i for s, i in zip(sub, idx, strict=True)}
    out = [[pos[id(s)] for s in mb] for mb in micro_batch_groups(sub, mb_spec)]
    count = common_count(len(out), mb_spec)
    while len(out) < count:
        out.append([-1])
    return out


def group_of(samples: Sequence[Sample], group_idx: list[int]) -> list[Sample]:
    """The samples of one micro-batch of indices; -1 becomes a dummy."""
    return [samples[i] if i >= 0 else dummy_like(samples[0]) for i in group_idx]


@torch.no_grad()
def compute_logprobs(model: nn.Module, samples: Sequence[Sample], *, pad_id: int, device: torch.device,
                     temperature: float, mb_spec: MicroBatchSpec, chunk_tokens: int) -> list[list[float]]:
    """Per-sample completion-token log-probs under `model` at `temperature` (the head `chunk_tokens` at a time);
    collective."""
    model.eval()
    out: dict[int, list[float]] = {}  # by index: packed micro-batches group the samples by tokens, not in order
    for group_idx in micro_batches_idx(samples, list(range(len(samples))), mb_spec):
        group = group_of(samples, group_idx)
        mb = pack(group, pad_id).to(device)
        logp, _ = token_logprobs(model, mb, temperature, chunk_tokens=chunk_tokens)
        for row, (i, s) in enumerate(zip(group_idx, group, strict=True)):
            if i >= 0:  # fillers only kept the ranks in step
                start = len(s.prompt_ids) - 1
                out[i] = logp[row, start : start + len(s.completion_ids)].float().cpu().tolist()
    return [out[i] for i in range(len(samples))]


def aligned(mb: MicroBatch, group_idx: list[int], per_sample: dict[int, list[float]]) -> Tensor:
    """Per-sample completion values placed at the micro-batch's completion positions."""
    out = torch.zeros_like(mb.behav_logp)
    for row, i in enumerate(group_idx):
        if i < 0:
            continue
        values = per_sample[i]
        start = int(mb.attention_mask[row].sum()) - len(values) - 1
        out[row, start : start + len(values)] = torch.tensor(values, dtype=out.dtype, device=out.device)
    return out


def minibatch_steps(engine: TrainEngine, samples: Sequence[Sample], minibatches: list[list[int]],
                    mb_spec: MicroBatchSpec, loss_fn: Callable[[nn.Module, list[int]], tuple[Tensor, int]], *,
                    mask_truncated: bool, per_sequence: bool = False, epochs: int = 1) -> tuple[float, float]:
    """One optimizer step per minibatch (this rank's global indices of `samples`), each over its token-budget
    micro-batches, the loss a mean over the minibatch's trained tokens (sampled ones only: the count must equal the
    packed loss masks' sum; a truncated completion counts none when `mask_truncated`), or with `per_sequence` over its
    sequences that have a trained token (the count must equal the packed rows whose loss mask has one: the seq-mean
    modes of rlkit.trainer.rl_math.aggregation); `epochs` passes over the minibatches, in the same order each pass
    (verl's ppo_epochs: its minibatches are split once, not reshuffled). Returns (mean gradient norm, last learning
    rate): the PPO actor's and critic's update loop."""
    grad_norms: list[float] = []
    lr = 0.0
    for idx in minibatches * epochs:
        sub = [samples[i] for i in idx]
        trained = [sampled_count(s) for s in sub if not s.dummy and (s.finished or not mask_truncated)]
        counted = sum(1 for n in trained if n > 0) if per_sequence else sum(trained)
        step = engine.optimizer_step(micro_batches_idx(sub, idx, mb_spec), loss_fn, counted)
        grad_norms.append(step["grad_norm"])
        lr = step["lr"]
    return sum(grad_norms) / max(1, len(grad_norms)), lr
