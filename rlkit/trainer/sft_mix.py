"""The SFT+RL mix (Trinity-RFT's `mix`): each RL optimizer step also takes the SFT loss of expert rows, so the
gradient is that of (1 - mu) * RL loss + mu * SFT loss (rlkit.trainer.rl_math.opmd.mixed_loss), each a token-mean
over its own tokens of the whole minibatch (all ranks).

Why not a second optimizer step on the expert rows: then the RL step and the SFT step would each move the weights
on their own (and the learning-rate schedule would count twice as many steps); the mix is one objective. Both kinds
of micro-batches go through one `TrainEngine.optimizer_step`: each micro-batch's loss is already its share of the
global objective (its token sum over the minibatch's global token count), so every one counts as `world` units of a
global `world` (the engine then scales it by 1 before FSDP's average over ranks turns the ranks' sums into one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rlkit.config.schema.actor import MicroBatchSpec
from rlkit.trainer.batch import pack
from rlkit.trainer.dist import all_reduce_sum
from rlkit.trainer.engine import TrainEngine, token_logprobs
from rlkit.trainer.sample_forward import group_of, micro_batches_idx
from rlkit.trainer.sampled_tokens import sampled_count
from rlkit.types import Sample

RLLoss = Callable[[nn.Module, list[int]], tuple[Tensor, int]]  # (model, indices) -> (token-mean loss, tokens)


@dataclass(frozen=True)
class ExpertBatch:
    """A step's expert rows (the same on every rank) and the mix's weight `mu` of their SFT loss."""

    samples: list[Sample]
    mu: float


def mixed_minibatch_steps(engine: TrainEngine, samples: Sequence[Sample], minibatches: list[list[int]],
                          expert: ExpertBatch, expert_minibatches: list[list[int]], *, mb_spec: MicroBatchSpec,
                          rl_loss: RLLoss, pad_id: int, chunk_tokens: int, mask_truncated: bool, epochs: int = 1
                          ) -> tuple[float, float, dict[str, float]]:
    """One optimizer step per minibatch over its RL micro-batches and its share of the expert rows (this rank's
    indices in `expert_minibatches`), `epochs` passes over them all (as rlkit.trainer.sample_forward.minibatch_steps);
    collective. Returns (mean gradient norm, last LR, the mix's metrics)."""
    mu = expert.mu
    grad_norms: list[float] = []
    lr = 0.0
    nll_sum, expert_tokens = [0.0], [0.0]
    for idx, ex_idx in zip(minibatches * epochs, expert_minibatches * epochs, strict=True):
        sub = [samples[i] for i in idx]
        ex_sub = [expert.samples[i] for i in ex_idx]
        rl_tokens = sum(sampled_count(s) for s in sub if not s.dummy and (s.finished or not mask_truncated))
        ex_tokens = sum(sampled_count(s) for s in ex_sub)
        g_rl, g_ex = all_reduce_sum([float(rl_tokens), float(ex_tokens)])
        tagged: list[tuple[str, list[int]]] = [("rl", g) for g in micro_batches_idx(sub, idx, mb_spec)]
        tagged += [("sft", g) for g in micro_batches_idx(ex_sub, ex_idx, mb_spec)]

        def loss_fn(model: nn.Module, item: tuple[str, list[int]], g_rl: float = g_rl, g_ex: float = g_ex
                    ) -> tuple[Tensor, int]:
            kind, group_idx = item
            if kind == "rl":
                loss, n_tok = rl_loss(model, group_idx)
                return (1.0 - mu) * loss * n_tok / max(1.0, g_rl), engine.world
            mb = pack(group_of(expert.samples, group_idx), pad_id).to(engine.device)
            logp, _ = token_logprobs(model, mb, 1.0, chunk_tokens=chunk_tokens)  # the model's own likelihood
            nll = -torch.where(mb.loss_mask, logp, 0.0).sum()
            nll_sum[0] += float(nll.detach())
            expert_tokens[0] += float(mb.loss_mask.sum())
            return mu * nll / max(1.0, g_ex), engine.world

        step = engine.optimizer_step(tagged, loss_fn, 1.0)  # each micro-batch is its own share: see the docstring
        grad_norms.append(step["grad_norm"])
        lr = step["lr"]
    total_nll, total_tokens = all_reduce_sum([nll_sum[0], expert_tokens[0]])
    stats = {"mix/sft_loss": total_nll / max(1.0, total_tokens), "mix/expert_tokens": total_tokens,
             "mix/mu": mu}
    return sum(grad_norms) / max(1, len(grad_norms)), lr, stats
