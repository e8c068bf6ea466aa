"""The PPO critic on its own TrainEngine: a value per token (rlkit.models.value_model) and clipped value-loss steps.

The engine is the actor's kind (FSDP, optimizer, LR schedule, sharded checkpoints) over a different model: the value
model from critic.path (empty: actor.path), with the `critic` section's dtype, optimizer, micro-batches and
minibatches. Values are taken before the advantages (GAE bootstraps from them); the returns GAE gives back are the
targets of the value loss (CriticLoss, critic.eps_clip).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rlkit.config.schema.actor import ActorConfig
from rlkit.config.schema.critic import CriticConfig
from rlkit.models import ulysses
from rlkit.models.value_model import token_values
from rlkit.trainer.batch import dummy_like, local_indices, pack
from rlkit.trainer.dist import all_reduce_sum
from rlkit.trainer.engine import TrainEngine, value_head_model
from rlkit.trainer.head_logprobs import sequence_parallel_split, split_forward
from rlkit.trainer.rl_math.value_loss import ppo_value_loss
from rlkit.trainer.sample_forward import aligned, group_of, micro_batches_idx, minibatch_steps
from rlkit.trainer.sampled_tokens import sampled_mask
from rlkit.types import Sample

_SUMMED = ("loss", "clip_fraction", "value", "return")  # token means of ppo_value_loss's statistics


def state_values(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """[B, L-1] the critic's value of the state before each next token, aligned with rlkit.trainer.batch's per-token
    tensors (position p: the value of tokens 0..p, from which token p+1 is sampled); 0 where no token follows (a
    row's final token is no state). Under Ulysses sequence parallelism (rlkit.models.ulysses) a packed row is split
    as the actor's is and the values gathered the same way, each rank's gradient to its own slice; padded rows run
    whole on every rank of the sp group, their gradient shared."""
    if not ulysses.enabled(model):
        values = token_values(model, input_ids, attention_mask)[:, :-1]
        return torch.where(attention_mask[:, 1:].bool(), values, 0.0)
    size, rows, piece = sequence_parallel_split(model, input_ids, attention_mask)
    if rows is None or piece is None:
        with ulysses.unsplit(model):
            return ulysses.shared_gradient(state_values(model, input_ids, attention_mask), size)
    values = split_forward(model, piece).logits.squeeze(-1).float()  # [1, N/sp]: the value at each token
    return rows.unpack_next(piece.gather(values))  # positions that predict a next token of their row


@dataclasses.dataclass(frozen=True)
class CriticLoss:
    """The critic's loss_fn over a micro-batch with old values and returns at the completion positions."""

    eps_clip: float

    def __call__(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor, old_values: Tensor,
                 returns: Tensor, loss_mask: Tensor) -> tuple[Tensor, int, dict[str, float]]:
        values = state_values(model, input_ids, attention_mask)
        loss, stats = ppo_value_loss(values, old_values, returns, loss_mask, eps_clip=self.eps_clip,
                                     reduction="sum")
        return loss, int(loss_mask.sum()), {name: float(value) for name, value in stats.items()}


def critic_engine_config(critic: CriticConfig, actor: ActorConfig) -> ActorConfig:
    """The engine's view of the critic: the actor's section with the critic's model, dtype, optimizer and batching
    (the engine reads path, dtype, attn_impl, gradient_checkpointing, fsdp and optimizer)."""
    return dataclasses.replace(
        actor, path=critic.path or actor.path, dtype=critic.dtype, attn_impl=critic.attn_impl,
        gradient_checkpointing=critic.gradient_checkpointing, mb_spec=critic.mb_spec, optimizer=critic.optimizer,
        fsdp=critic.fsdp,
        ppo_n_minibatches=critic.ppo_n_minibatches, use_lora=False,  # the critic trains its whole model
        ppo_epochs=critic.ppo_epochs or actor.ppo_epochs, entropy_coeff=0.0,
        disable_dropout=critic.disable_dropout, init_from_scratch=False,
        mask_no_eos_with_zero=critic.mask_no_eos_with_zero)  # its own, as AReaL's PPOCritic has its own


class PPOCritic:
    """The value model being trained (`engine`), named "critic" in the loop's checkpoints."""

    def __init__(self, config: ActorConfig, engine: TrainEngine, *, eps_clip: float, pad_id: int) -> None:
        self.config, self.engine, self.pad_id = config, engine, pad_id
        self.loss = CriticLoss(eps_clip=eps_clip)

    @classmethod
    def build(cls, critic: CriticConfig, actor: ActorConfig, *, rank: int, world: int, device: torch.device,
              pad_id: int, total_optimizer_steps: int) -> PPOCritic:
        """Collective: the sharded value model and its optimizer."""
        config = critic_engine_config(critic, actor)
        engine = TrainEngine(config, rank=rank, world=world, device=device,
                             total_optimizer_steps=total_optimizer_steps, model_factory=value_head_model)
        return cls(config, engine, eps_clip=critic.eps_clip, pad_id=pad_id)

    def local_indices(self, samples: Sequence[Sample]) -> list[list[int]]:
        """Per minibatch, this rank's indices of the global batch `samples`, balanced by tokens."""
        rank, world = self.engine.data_rank_world  # under sequence parallelism, the sp group's share
        return local_indices(len(samples), self.config.ppo_n_minibatches, rank, world,
                             lengths=[s.length for s in samples], algorithm=self.config.mb_spec.packing_algorithm)

    @torch.no_grad()
    def values_at(self, samples: Sequence[Sample]) -> dict[int, list[float]]:
        """This rank's share of the batch: each sample's value of the state before every completion token, keyed by
        global index; collective (every rank runs as many micro-batches)."""
        mine = sorted(i for part in self.local_indices(samples) for i in part)
        sub = [samples[i] for i in mine] or [dummy_like(samples[0])]
        model = self.engine.model
        model.eval()
        out: dict[int, list[float]] = {}
        for group_idx in micro_batches_idx(sub, list(range(len(sub))), self.config.mb_spec):
            group = group_of(sub, group_idx)
            mb = pack(group, self.pad_id).to(self.engine.device)
            values = state_values(model, mb.input_ids, mb.attention_mask)
            for row, (i, s) in enumerate(zip(group_idx, group, strict=True)):
                if i >= 0 and mine:
                    start = len(s.prompt_ids) - 1
                    out[mine[i]] = values[row, start : start + len(s.completion_ids)].float().cpu().tolist()
        return out

    def train_step(self, samples: Sequence[Sample], old_values: dict[int, list[float]],
                   returns: list[list[float]]) -> dict[str, float]:
        """critic.ppo_n_minibatches optimizer steps of the value loss over the global batch (each rank its share),
        critic.ppo_epochs passes of them; `old_values` (every sample's, by global index) are the clip's anchor,
        `returns` the targets. Returns statistics averaged over all ranks' tokens (and passes)."""
        targets = dict(enumerate(returns))
        sums = dict.fromkeys((*_SUMMED, "tokens"), 0.0)
        mask_truncated = self.config.mask_no_eos_with_zero

        def loss_fn(model: nn.Module, group_idx: list[int]) -> tuple[Tensor, int]:
            mb = pack(group_of(samples, group_idx), self.pad_id, mask_truncated=mask_truncated).to(self.engine.device)
            total, n_tok, stats = self.loss(model, mb.input_ids, mb.attention_mask, aligned(mb, group_idx, old_values),
                                            aligned(mb, group_idx, targets), mb.loss_mask)
            for key in _SUMMED:
                sums[key] += stats[key] * n_tok
            sums["tokens"] += n_tok
            return total / max(1, n_tok), n_tok  # the engine takes the token mean and weighs it by n_tok

        grad_norm, lr = minibatch_steps(self.engine, samples, self.local_indices(samples), self.config.mb_spec,
                                        loss_fn, mask_truncated=mask_truncated, epochs=self.config.ppo_epochs)
        reduced = dict(zip(sums, all_reduce_sum(list(sums.values())), strict=True))
        tokens = max(1.0, reduced.pop("tokens"))
        return {"critic/value_loss": reduced["loss"] / tokens,
                "critic/clip_fraction": reduced["clip_fraction"] / tokens,
                "critic/values_trained_mean": reduced["value"] / tokens,
                "critic/grad_norm": grad_norm, "critic/lr": lr}


def batch_means(samples: Sequence[Sample], values: dict[int, list[float]], returns: list[list[float]]
                ) -> dict[str, float]:
    """Token means of the rollout-time values and of the returns over the batch's real sampled completion tokens
    (a multi-turn episode's inserted tokens are no states the critic is trained on)."""
    n, v, r = 0, 0.0, 0.0
    for i, s in enumerate(samples):
        if s.dummy:
            continue
        sampled = sampled_mask(s)
        n += sum(sampled)
        v += sum(x for x, keep in zip(values[i], sampled, strict=True) if keep)
        r += sum(x for x, keep in zip(returns[i], sampled, strict=True) if keep)
    return {"critic/values_mean": v / max(1, n), "critic/returns_mean": r / max(1, n)}
