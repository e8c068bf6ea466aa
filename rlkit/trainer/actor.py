"""The PPO/GRPO actor: the trained policy's log-probs and its clipped-surrogate steps on a TrainEngine.

The engine owns the model, optimizer and scaling; this module owns what is PPO about a step: the minibatch split,
the loss (rlkit.trainer.rl_math.losses.ppo_actor_loss, plus kl_loss_coef x KL to the frozen reference; kl_ctl is a
reward penalty, applied before the advantages in rlkit.trainer.rl_math.advantage_batch), both averaged as
actor.loss_agg_mode says (rlkit.trainer.rl_math.aggregation), and its statistics.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor, nn

from rlkit.config.schema.actor import ActorConfig, approximates_proximal, kl_terms_on, reuses_training_logprobs
from rlkit.config.schema.ref import ReferenceLoad, loads_a_copy
from rlkit.models.packing import set_packing
from rlkit.models.source import has_active_dropout
from rlkit.trainer.batch import MicroBatch, dummy_like, local_indices, pack
from rlkit.trainer.dist import all_reduce_max, all_reduce_sum
from rlkit.trainer.engine import TrainEngine, actor_model_factory, token_logprobs
from rlkit.trainer.reference import adapter_off, frozen_reference
from rlkit.trainer.rl_math.aggregation import aggregate, loss_units
from rlkit.trainer.rl_math.kl import kl_estimate
from rlkit.trainer.rl_math.losses import ppo_actor_loss
from rlkit.trainer.rl_math.proximal import proximal_logp, stat_names, version_lists
from rlkit.trainer.sample_forward import aligned, compute_logprobs, group_of, minibatch_steps
from rlkit.trainer.sft_mix import ExpertBatch, mixed_minibatch_steps
from rlkit.types import Sample

_WEIGHTED = ("clip_fraction", "dual_clip_fraction", "importance_weight_mean", "behav_weight_mean",
             "behav_filtered_fraction", "sapo_soft_gate", "m2po_masked_fraction")
# (logp, old_logp, advantages, loss_mask) -> (loss averaged as actor.loss_agg_mode says, stats): a job type's own
# policy loss (opmd)
PolicyLoss = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, dict[str, Tensor]]]
_COUNTED = ("log_ratio_clamped", "seq_log_ratio_clamped", "kl_loss_clamped")  # guards that bit: tokens (GSPO: seqs)


class ExtraLoss(Protocol):
    """A term added to the actor's loss of each micro-batch (job type distill's top-k forward KL): its value (a mean
    over the micro-batch's loss-mask tokens) and its statistics (per-token means, named `names`)."""

    names: tuple[str, ...]

    def __call__(self, model: nn.Module, mb: MicroBatch, group_idx: list[int], logp: Tensor
                 ) -> tuple[Tensor, dict[str, float]]: ...


class PPOActor:
    """The policy being trained (`engine`) and, when the config asks for one, its frozen reference (`ref`; with
    LoRA and no other reference model none: the reference is the trained model with its adapter switched off, which
    is the initial model). `loss_scale_factor`: seq-mean-token-sum-norm's constant (actor.loss_scale_factor, else
    gconfig.max_new_tokens; rlkit.trainer.rl_math.aggregation)."""

    def __init__(self, config: ActorConfig, engine: TrainEngine, *, pad_id: int, temperature: float,
                 ref: nn.Module | None = None, loss_scale_factor: float | None = None) -> None:
        self.config, self.engine, self.ref = config, engine, ref
        self.pad_id, self.temperature = pad_id, temperature
        self.loss_scale_factor = config.loss_scale_factor or loss_scale_factor
        self.has_reference = ref is not None or (config.use_lora and kl_terms_on(config))
        self.extra_loss: ExtraLoss | None = None  # set by an algorithm for its next train_step
        # the weight version the trained weights carry (the servers' numbering), set by an algorithm before each
        # train_step: prox_logp_method loglinear and metrics interpolate by it (rlkit.trainer.rl_math.proximal)
        self.current_version: int | None = None
        # whether the update's own forward gives the proximal log-probs (no recompute: reuses_training_logprobs);
        # then train_step keeps them, per sample of this rank, for the step's log-prob mismatch check
        self.reuses_training_logprobs = reuses_training_logprobs(config, dropout=has_active_dropout(engine.model))
        self.training_logp: dict[int, list[float]] | None = None

    @classmethod
    def build(cls, config: ActorConfig, *, rank: int, world: int, device: torch.device, pad_id: int,
              temperature: float, total_optimizer_steps: int, ref: ReferenceLoad | None = None,
              max_new_tokens: int | None = None) -> PPOActor:
        """The engine of the causal LM at config.path, and the reference when needed: `ref` (the job's
        rlkit.config.reference.reference_load; None: the actor's start); collective. `max_new_tokens`
        (gconfig's): seq-mean-token-sum-norm's constant unless actor.loss_scale_factor."""
        engine = TrainEngine(config, rank=rank, world=world, device=device,
                             total_optimizer_steps=total_optimizer_steps, model_factory=actor_model_factory(config))
        load = ref or ReferenceLoad(config.path, config.dtype, config.attn_impl)
        model = frozen_reference(load, device) if kl_terms_on(config) and loads_a_copy(config, load) else None
        if model is not None:
            set_packing(model, config.mb_spec.packing)
        return cls(config, engine, pad_id=pad_id, temperature=temperature, ref=model, loss_scale_factor=max_new_tokens)

    def local_indices(self, samples: Sequence[Sample]) -> list[list[int]]:
        """Per minibatch (ppo_n_minibatches), this rank's indices of the global batch `samples`, balanced by tokens."""
        rank, world = self.engine.data_rank_world  # under sequence parallelism, the sp group's share
        return local_indices(len(samples), self.config.ppo_n_minibatches, rank, world,
                             lengths=[s.length for s in samples], algorithm=self.config.mb_spec.packing_algorithm)

    def compute_logprobs(self, samples: Sequence[Sample], *, reference: bool = False,
                         temperature: float | None = None) -> list[list[float]]:
        """Per-sample completion-token log-probs under the current (or reference) weights, at the sampling temperature
        unless `temperature` is given; collective."""
        if reference and not self.has_reference:
            raise RuntimeError("no reference model (kl_ctl and kl_loss_coef are 0)")
        model = self.ref if reference and self.ref is not None else self.engine.model
        with adapter_off(model) if reference and self.ref is None else contextlib.nullcontext(model):
            return compute_logprobs(model, samples, pad_id=self.pad_id, device=self.engine.device,
                                    temperature=self.temperature if temperature is None else temperature,
                                    mb_spec=self.config.mb_spec, chunk_tokens=self.config.logprob_chunk_tokens)

    def logprobs_at(self, samples: Sequence[Sample], *, reference: bool = False,
                    temperature: float | None = None) -> dict[int, list[float]]:
        """compute_logprobs for this rank's samples of a global batch, keyed by global index; collective."""
        mine = sorted(i for part in self.local_indices(samples) for i in part)
        values = self.compute_logprobs([samples[i] for i in mine] or [dummy_like(samples[0])], reference=reference,
                                       temperature=temperature)
        return dict(zip(mine, values, strict=False))

    def train_step(self, samples: Sequence[Sample], old_logp: dict[int, list[float]] | None,
                   ref_logp: dict[int, list[float]] | None, *, policy_loss: PolicyLoss | None = None,
                   expert: ExpertBatch | None = None) -> dict[str, float]:
        """ppo_n_minibatches optimizer steps over the global batch `samples` (each rank does its share), ppo_epochs
        passes of them; returns statistics averaged over all ranks' tokens and passes (the loss: over its units,
        actor.loss_agg_mode's).

        `old_logp` (recomputed before the update, by global index) is the proximal policy; without it each
        micro-batch's own training forward (detached) when `reuses_training_logprobs` (the step skipped the recompute
        because that forward gives the same numbers; kept in `training_logp`), else the servers' behaviour log-probs.
        With use_decoupled_loss both are used (weight exp(old - behav)); prox_logp_method loglinear approximates the
        proximal policy instead (no `old_logp`), metrics also measures that approximation, both by each token's weight
        version and `current_version`.
        `policy_loss` replaces the clipped surrogate (job type opmd); `expert` mixes the SFT loss of expert rows
        into every optimizer step (rlkit.trainer.sft_mix).
        """
        cfg = self.config
        sums = {"loss": 0.0, "entropy": 0.0, "kl": 0.0, "clip_fraction": 0.0, "dual_clip_fraction": 0.0,
                "importance_weight_mean": 0.0, "behav_weight_mean": 0.0, "behav_filtered_fraction": 0.0, "tokens": 0.0,
                "units": 0.0, "sapo_soft_gate": 0.0, "m2po_masked_fraction": 0.0}
        counts = dict.fromkeys(_COUNTED, 0.0)
        extra = self.extra_loss
        extra_sums = dict.fromkeys(extra.names if extra is not None else (), 0.0)
        max_ratio = [0.0]
        reuse = old_logp is None and self.reuses_training_logprobs  # this forward is the skipped recompute
        proximal = old_logp is not None or reuse
        decoupled = cfg.use_decoupled_loss and (proximal or approximates_proximal(cfg))
        kept: dict[int, list[float]] | None = {} if reuse else None
        self.training_logp = kept
        mode, scale = cfg.loss_agg_mode, self.loss_scale_factor
        if mode != "token-mean" and (expert is not None or extra is not None):  # refused at submit
            raise ValueError(f"actor.loss_agg_mode {mode}: the SFT+RL mix and an extra loss term are token-means")
        prox_method = cfg.prox_logp_method if cfg.use_decoupled_loss else "recompute"
        prox_sums = dict.fromkeys(stat_names(prox_method), 0.0)
        versions = version_lists(samples) if prox_sums else {}

        def loss_fn(model: nn.Module, group_idx: list[int]) -> tuple[Tensor, int]:
            mb = pack(group_of(samples, group_idx), self.pad_id,
                      mask_truncated=cfg.mask_no_eos_with_zero).to(self.engine.device)
            logp, entropy = token_logprobs(model, mb, self.temperature, with_entropy=True,
                                           chunk_tokens=cfg.logprob_chunk_tokens, entropy_grad=cfg.entropy_coeff > 0)
            if kept is not None:
                old = logp.detach()
                _keep(kept, logp, samples, group_idx)
            else:
                old = aligned(mb, group_idx, old_logp) if old_logp is not None else mb.behav_logp
            prox_stats: dict[str, Tensor] = {}
            if prox_sums:  # loglinear: the approximation replaces `old`; metrics: measured against it
                tok_versions = torch.where(mb.loss_mask, aligned(mb, group_idx, versions), -1.0)
                old, prox_stats = proximal_logp(prox_method, old if proximal else None, mb.behav_logp,
                                                logp, tok_versions, self.current_version, mb.loss_mask)
            if policy_loss is not None:
                loss, stats = policy_loss(logp, old, mb.advantages, mb.loss_mask)
            else:
                loss, stats = ppo_actor_loss(
                    logp, old, mb.advantages, mb.loss_mask, eps_clip=cfg.eps_clip,
                    eps_clip_higher=cfg.eps_clip_higher, c_clip=cfg.c_clip,
                    importance_sampling_level=cfg.importance_sampling_level,  # type: ignore[arg-type]
                    behav_logp=mb.behav_logp if decoupled else None, behav_imp_weight_cap=cfg.behav_imp_weight_cap,
                    rejection_sampling=cfg.rejection_sampling, log_ratio_clamp=cfg.log_ratio_clamp,
                    seq_log_ratio_clamp=cfg.seq_log_ratio_clamp, m2_threshold=cfg.m2_threshold,
                    sapo_taus=(cfg.sapo_tau_pos, cfg.sapo_tau_neg) if cfg.use_sapo_loss else None,
                    loss_agg_mode=mode, loss_scale_factor=scale, policy_loss=cfg.policy_loss)
            mask = mb.loss_mask
            n_tok = int(mask.sum())
            units = loss_units(mask, mode)  # what `loss` is a mean over: tokens, or sequences
            if ref_logp is not None and cfg.kl_loss_coef > 0:  # the KL loss term (kl_ctl is a reward penalty)
                kl, kl_clamped = kl_estimate(logp, aligned(mb, group_idx, ref_logp), cfg.kl_loss_type,
                                             clamp=cfg.kl_clamp)
                kl_term, _ = aggregate(kl, mask, mode, scale_factor=scale)
                loss = loss + cfg.kl_loss_coef * kl_term
                sums["kl"] += float(torch.where(mask, kl, 0.0).sum())  # the statistic: a token-mean
                counts["kl_loss_clamped"] += float((kl_clamped & mask).sum())
            if cfg.entropy_coeff > 0:  # the entropy bonus, averaged as the policy loss (verl's agg_loss)
                assert entropy is not None
                loss = loss - cfg.entropy_coeff * aggregate(entropy, mask, mode, scale_factor=scale)[0]
            if extra is not None:
                term, term_stats = extra(model, mb, group_idx, logp)
                loss = loss + term
                for key in extra_sums:
                    extra_sums[key] += term_stats.get(key, 0.0) * n_tok
            if n_tok:
                sums["loss"] += float(loss.detach()) * units
                sums["units"] += units
                sums["tokens"] += n_tok
                assert entropy is not None
                sums["entropy"] += float(torch.where(mask, entropy.detach(), 0.0).sum())
                for key in _WEIGHTED:
                    if key in stats:
                        sums[key] += float(stats[key]) * n_tok
                max_ratio[0] = max(max_ratio[0], float(stats.get("importance_weight_max", 0.0)))
                for key in ("log_ratio_clamped", "seq_log_ratio_clamped"):
                    counts[key] += float(stats.get(key, 0.0))
                for key in prox_sums:
                    prox_sums[key] += float(prox_stats[key]) * n_tok
            return loss, units

        mix: dict[str, float] = {}
        if expert is not None:
            grad_norm, lr, mix = mixed_minibatch_steps(
                self.engine, samples, self.local_indices(samples), expert, self.local_indices(expert.samples),
                mb_spec=cfg.mb_spec, rl_loss=loss_fn, pad_id=self.pad_id, chunk_tokens=cfg.logprob_chunk_tokens,
                mask_truncated=cfg.mask_no_eos_with_zero, epochs=cfg.ppo_epochs)
        else:
            grad_norm, lr = minibatch_steps(self.engine, samples, self.local_indices(samples), cfg.mb_spec, loss_fn,
                                            mask_truncated=cfg.mask_no_eos_with_zero,
                                            per_sequence=mode != "token-mean", epochs=cfg.ppo_epochs)
        reduced = dict(zip(sums, all_reduce_sum(list(sums.values())), strict=True))
        tokens, units = max(1.0, reduced.pop("tokens")), max(1.0, reduced.pop("units"))
        totals: dict[str, float] = {f"actor/{k}": v / tokens for k, v in reduced.items()}
        totals["actor/loss"] = reduced["loss"] / units  # the loss as trained: a mean over its units
        if not decoupled:
            totals.pop("actor/behav_weight_mean")
            totals.pop("actor/behav_filtered_fraction")
        for key, on in (("sapo_soft_gate", cfg.use_sapo_loss), ("m2po_masked_fraction", cfg.m2_threshold is not None)):
            if not on or policy_loss is not None:
                totals.pop(f"actor/{key}")
        totals.update({f"actor/{k}": v for k, v in zip(counts, all_reduce_sum(list(counts.values())), strict=True)})
        totals["actor/importance_weight_max"] = float(all_reduce_max(int(max_ratio[0] * 1e6))) / 1e6
        if extra_sums:
            totals.update({k: v / tokens for k, v in zip(extra_sums, all_reduce_sum(list(extra_sums.values())),
                                                           strict=True)})
        if prox_sums:
            reduced_prox = all_reduce_sum(list(prox_sums.values()))
            totals.update({f"actor/{k}": v / tokens for k, v in zip(prox_sums, reduced_prox, strict=True)})
        totals["actor/grad_norm"] = grad_norm
        totals["actor/lr"] = lr
        totals.update(mix)
        return totals


def _keep(into: dict[int, list[float]], logp: Tensor, samples: Sequence[Sample], group_idx: list[int]) -> None:
    """Each real sample's completion log-probs of a micro-batch's forward, by global index (as compute_logprobs)."""
    values = logp.detach().float().cpu()
    for row, i in enumerate(group_idx):
        if i >= 0:
            start = len(samples[i].prompt_ids) - 1
            into[i] = values[row, start : start + len(samples[i].completion_ids)].tolist()
