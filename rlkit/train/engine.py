"""The FSDP2 policy engine: load a Hugging Face causal LM, shard it, compute token log-probs, take PPO steps.

Every method that touches the model is collective: all ranks call it in the same order (FSDP all-gathers
parameters in forward). Ranks with fewer micro-batches than others run dummy ones that count for nothing.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlkit.config.schema_actor import ActorConfig, OptimizerConfig
from rlkit.train.batch import MicroBatch, Sample, dummy_like, pack, split_micro_batches
from rlkit.train.dist import all_reduce_max, all_reduce_sum
from rlkit.train.kl import kl_estimate
from rlkit.train.losses import entropy_from_logits, ppo_actor_loss

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def attention_implementation(requested: str) -> str:
    """flash_attention_2 only when flash-attn is importable (GPU images); sdpa otherwise."""
    if requested == "flash_attention_2" and (importlib.util.find_spec("flash_attn") is None
                                             or not torch.cuda.is_available()):
        return "sdpa"
    return requested


def lr_multiplier(step: int, total: int, *, warmup_proportion: float, schedule: str, min_lr_ratio: float) -> float:
    """Learning-rate factor at optimizer step `step` of `total`: linear warmup, then constant/linear/cosine decay."""
    warmup = int(warmup_proportion * total)
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - (1.0 - min_lr_ratio) * progress
    if schedule == "cosine":
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_scheduler_type {schedule!r} (constant, linear or cosine)")


def load_causal_lm(path: str, *, dtype: torch.dtype, attn_impl: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attention_implementation(
        attn_impl))


def shard_model(model: nn.Module, *, param_dtype: torch.dtype | None) -> nn.Module:
    """fully_shard every decoder layer, then the whole model (FSDP2)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else None
    kwargs: dict[str, Any] = {"mp_policy": mp} if mp is not None else {}
    layers = getattr(getattr(model, "model", model), "layers", None)
    for layer in layers or []:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def token_logprobs(model: nn.Module, mb: MicroBatch, temperature: float, *, with_entropy: bool = False
                   ) -> tuple[Tensor, Tensor | None]:
    """[B, L-1] log-probs of each next token under `model` (logits / temperature), and optionally entropies."""
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
    logits = out.logits[:, :-1].float() / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())
    return logp, entropy


class PolicyEngine:
    """The trained policy (and its frozen reference when kl_ctl or kl_loss_coef > 0) on this rank's shard."""

    def __init__(self, config: ActorConfig, *, rank: int, world: int, device: torch.device, pad_id: int,
                 temperature: float, total_optimizer_steps: int) -> None:
        self.config = config
        self.rank, self.world, self.device = rank, world, device
        self.pad_id = pad_id
        self.temperature = temperature
        train_dtype = DTYPES[config.dtype]
        # Master weights stay float32; bf16/fp16 is the compute dtype through FSDP's mixed-precision policy.
        self.model = load_causal_lm(config.path, dtype=torch.float32, attn_impl=config.attn_impl)
        if config.gradient_checkpointing:
            kwargs = {"use_reentrant": False}
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
        self.model.to(device)
        param_dtype = None if train_dtype == torch.float32 else train_dtype
        shard_model(self.model, param_dtype=param_dtype)
        self.ref: nn.Module | None = None
        if config.kl_ctl > 0 or config.kl_loss_coef > 0:
            ref = load_causal_lm(config.path, dtype=torch.float32, attn_impl=config.attn_impl).to(device)
            ref.requires_grad_(False).eval()
            self.ref = shard_model(ref, param_dtype=param_dtype)
        self.optimizer = self._make_optimizer(config.optimizer)
        self.total_optimizer_steps = max(1, total_optimizer_steps)
        self.optimizer_steps = 0

    def _make_optimizer(self, cfg: OptimizerConfig) -> torch.optim.Optimizer:
        params = [p for p in self.model.parameters() if p.requires_grad]
        if cfg.type == "adam":
            return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                     weight_decay=cfg.weight_decay)
        if cfg.type == "sgd":
            return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        raise ValueError(f"unknown optimizer type {cfg.type!r}")

    @torch.no_grad()
    def compute_logprobs(self, samples: Sequence[Sample], *, reference: bool = False,
                         temperature: float | None = None) -> list[list[float]]:
        """Per-sample completion-token log-probs under the current (or reference) weights, at the sampling temperature
        unless `temperature` is given; collective."""
        model = self.ref if reference else self.model
        if model is None:
            raise RuntimeError("no reference model (kl_ctl and kl_loss_coef are 0)")
        model.eval()
        out: list[list[float]] = []
        for group_idx in self._micro_batches_idx(samples, list(range(len(samples)))):
            group = [samples[i] if i >= 0 else dummy_like(samples[0]) for i in group_idx]
            mb = pack(group, self.pad_id).to(self.device)
            logp, _ = token_logprobs(model, mb, self.temperature if temperature is None else temperature)
            for row, (i, s) in enumerate(zip(group_idx, group, strict=True)):
                if i >= 0:  # fillers only kept the ranks in step
                    start = len(s.prompt_ids) - 1
                    out.append(logp[row, start : start + len(s.completion_ids)].float().cpu().tolist())
        return out

    def probe_logprobs(self, ids: list[int]) -> list[float]:
        """Log-probs of tokens 1..n of `ids` given their prefix at temperature 1 (the weight fingerprint);
        collective, computed exactly as for the servers' side of the check."""
        from rlkit.weights.fingerprint import trainer_probe_logprobs

        return trainer_probe_logprobs(self.model, ids)

    def local_indices(self, n: int) -> list[list[int]]:
        """Per minibatch, the indices of a global batch of `n` samples this rank trains on.

        Minibatch k is every ppo_n_minibatches-th sample from k; each minibatch is then dealt out over the ranks.
        The minibatches are therefore the same whatever the number of ranks.
        """
        n_mb = self.config.ppo_n_minibatches
        return [list(range(k, n, n_mb))[self.rank :: self.world] for k in range(n_mb)]

    def logprobs_at(self, samples: Sequence[Sample], *, reference: bool = False,
                    temperature: float | None = None) -> dict[int, list[float]]:
        """compute_logprobs for this rank's samples of a global batch, keyed by global index; collective."""
        mine = sorted(i for part in self.local_indices(len(samples)) for i in part)
        values = self.compute_logprobs([samples[i] for i in mine] or [dummy_like(samples[0])], reference=reference,
                                       temperature=temperature)
        return dict(zip(mine, values, strict=False))

    def train_step(self, samples: Sequence[Sample], old_logp: dict[int, list[float]] | None,
                   ref_logp: dict[int, list[float]] | None) -> dict[str, float]:
        """ppo_n_minibatches optimizer steps over the global batch `samples` (each rank does its share);
        returns statistics averaged over all ranks' tokens.

        `old_logp` (recomputed before the update, by global index) is the proximal policy; without it the
        servers' behaviour log-probs are used. With use_decoupled_loss both are used (weight exp(old - behav)).
        """
        cfg = self.config
        self.model.train()
        sums = {"loss": 0.0, "entropy": 0.0, "kl": 0.0, "clip_fraction": 0.0, "dual_clip_fraction": 0.0,
                "importance_weight_mean": 0.0, "behav_weight_mean": 0.0, "behav_filtered_fraction": 0.0, "tokens": 0.0}
        counts = {"log_ratio_clamped": 0.0, "seq_log_ratio_clamped": 0.0, "kl_loss_clamped": 0.0}
        max_ratio = 0.0
        grad_norms: list[float] = []
        for idx in self.local_indices(len(samples)):
            sub = [samples[i] for i in idx]
            counted = sum(len(s.completion_ids) for s in sub
                          if not s.dummy and (s.finished or not cfg.mask_no_eos_with_zero))
            global_tokens = all_reduce_sum([float(counted)])[0]
            self.optimizer.zero_grad(set_to_none=True)
            for group_idx in self._micro_batches_idx(sub, idx):
                group = [samples[i] if i >= 0 else dummy_like(samples[0]) for i in group_idx]
                mb = pack(group, self.pad_id, mask_truncated=cfg.mask_no_eos_with_zero).to(self.device)
                logp, entropy = token_logprobs(self.model, mb, self.temperature, with_entropy=True)
                old = self._aligned(mb, group_idx, old_logp) if old_logp is not None else mb.behav_logp
                behav = mb.behav_logp if (cfg.use_decoupled_loss and old_logp is not None) else None
                loss, stats = ppo_actor_loss(
                    logp, old, mb.advantages, mb.loss_mask, eps_clip=cfg.eps_clip,
                    eps_clip_higher=cfg.eps_clip_higher, c_clip=cfg.c_clip,
                    importance_sampling_level=cfg.importance_sampling_level,  # type: ignore[arg-type]
                    behav_logp=behav, behav_imp_weight_cap=cfg.behav_imp_weight_cap,
                    rejection_sampling=cfg.rejection_sampling, log_ratio_clamp=cfg.log_ratio_clamp,
                    seq_log_ratio_clamp=cfg.seq_log_ratio_clamp)
                mask = mb.loss_mask
                n_tok = int(mask.sum())
                kl_mean = torch.zeros((), device=self.device)
                if ref_logp is not None and cfg.kl_loss_coef > 0:  # the KL loss term (kl_ctl is a reward penalty)
                    ref = self._aligned(mb, group_idx, ref_logp)
                    kl, kl_clamped = kl_estimate(logp, ref, cfg.kl_loss_type, clamp=cfg.kl_clamp)
                    kl_mean = torch.where(mask, kl, 0.0).sum() / max(1, n_tok)
                    loss = loss + cfg.kl_loss_coef * kl_mean
                    counts["kl_loss_clamped"] += float((kl_clamped & mask).sum())
                # Token mean over the whole minibatch on all ranks: FSDP averages gradients over ranks.
                scale = n_tok * self.world / max(1.0, global_tokens)
                (loss * scale).backward()
                if n_tok:
                    sums["loss"] += float(loss.detach()) * n_tok
                    sums["kl"] += float(kl_mean) * n_tok
                    sums["tokens"] += n_tok
                    assert entropy is not None
                    sums["entropy"] += float(torch.where(mask, entropy, 0.0).sum())
                    for key in ("clip_fraction", "dual_clip_fraction", "importance_weight_mean",
                                "behav_weight_mean", "behav_filtered_fraction"):
                        if key in stats:
                            sums[key] += float(stats[key]) * n_tok
                    max_ratio = max(max_ratio, float(stats["importance_weight_max"]))
                    for key in counts:
                        counts[key] += float(stats.get(key, 0.0))
            grad_norms.append(self._clip_and_step())
        reduced = dict(zip(sums, all_reduce_sum(list(sums.values())), strict=True))
        tokens = max(1.0, reduced.pop("tokens"))
        totals: dict[str, float] = {f"actor/{k}": v / tokens for k, v in reduced.items()}
        if not (cfg.use_decoupled_loss and old_logp is not None):
            totals.pop("actor/behav_weight_mean")
            totals.pop("actor/behav_filtered_fraction")
        # Guards that bit this step (tokens; GSPO: sequences), summed over ranks.
        totals.update({f"actor/{k}": v for k, v in zip(counts, all_reduce_sum(list(counts.values())), strict=True)})
        totals["actor/importance_weight_max"] = float(all_reduce_max(int(max_ratio * 1e6))) / 1e6
        totals["actor/grad_norm"] = sum(grad_norms) / max(1, len(grad_norms))
        totals["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        return totals

    def _micro_batches_idx(self, sub: Sequence[Sample], idx: list[int]) -> list[list[int]]:
        """Micro-batches of sample indices (-1: a dummy), the same count on every rank."""
        pos = {id(s): i for s, i in zip(sub, idx, strict=True)}
        mbs = split_micro_batches(sub, max_tokens=self.config.mb_spec.max_tokens_per_mb,
                                  min_count=self.config.mb_spec.n_mbs)
        out = [[pos[id(s)] for s in mb] for mb in mbs]
        count = all_reduce_max(len(out))
        while len(out) < count:
            out.append([-1])
        return out

    def _aligned(self, mb: MicroBatch, group_idx: list[int], per_sample: dict[int, list[float]]) -> Tensor:
        """Per-sample completion values placed at the micro-batch's completion positions."""
        out = torch.zeros_like(mb.behav_logp)
        for row, i in enumerate(group_idx):
            if i < 0:
                continue
            values = per_sample[i]
            start = int(mb.attention_mask[row].sum()) - len(values) - 1
            out[row, start : start + len(values)] = torch.tensor(values, dtype=out.dtype, device=out.device)
        return out

    def _clip_and_step(self) -> float:
        cfg = self.config.optimizer
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.gradient_clipping if cfg.gradient_clipping > 0
                                              else float("inf"))
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        factor = lr_multiplier(self.optimizer_steps, self.total_optimizer_steps,
                               warmup_proportion=cfg.warmup_steps_proportion, schedule=cfg.lr_scheduler_type,
                               min_lr_ratio=cfg.min_lr_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr * factor
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1
        return float(norm)

    def full_state_dict(self) -> dict[str, Tensor]:
        """The whole model's weights on rank 0's CPU (empty on other ranks); collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v for k, v in state.items() if isinstance(v, Tensor)}

    def iter_full_buckets(self, max_bytes: int, dtype: torch.dtype | None = None
                          ) -> Iterator[dict[str, Tensor] | None]:
        """The whole model's weights in buckets of about `max_bytes` (a tensor larger than that is a bucket of its own):
        rank 0 yields each bucket as it fills (full tensors cast to `dtype`, on this rank's device); the other ranks
        yield one None at the end.

        Collective: every rank must run the iterator to its end (each parameter is all-gathered from its shards, in
        the same order on every rank; rank 0 may use a bucket before asking for the next one). Peak memory on rank 0
        is one bucket, not the model, which is what a streamed broadcast needs.
        """
        import torch.distributed as dist

        if max_bytes <= 0:
            raise ValueError(f"a bucket needs a positive size, got {max_bytes} bytes")
        rank0 = not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
        bucket: dict[str, Tensor] = {}
        size = 0
        for name, value in self.model.state_dict().items():
            if not isinstance(value, Tensor):
                continue
            full = value.full_tensor() if hasattr(value, "full_tensor") else value  # DTensor shard -> all-gather
            if not rank0:
                del full
                continue
            # only floating tensors take the push dtype (as hf_export writes them); integer buffers stay as they are
            full = full.detach().to(dtype) if dtype is not None and full.is_floating_point() else full.detach()
            if bucket and size + full.numel() * full.element_size() > max_bytes:
                yield bucket
                bucket, size = {}, 0
            bucket[name] = full
            size += full.numel() * full.element_size()
            if size >= max_bytes:
                yield bucket
                bucket, size = {}, 0
        if not rank0:
            yield None  # the other ranks' single step: they only take part in the gathers
        elif bucket:
            yield bucket

    def save_sharded(self, path: Path) -> dict[str, tuple[int, str]]:
        """Every rank writes its shards of the model and optimizer (torch.distributed.checkpoint); collective.
        Returns, on every rank, the size and xxh3-128 of every file any rank wrote, computed while writing."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        from rlkit.train.hashing_fs import hashing_writer

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        writer, fs = hashing_writer(path)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path), storage_writer=writer)
        if not (dist.is_available() and dist.is_initialized()):
            return fs.digests
        every: list[dict[str, tuple[int, str]] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(every, fs.digests)
        return {name: digest for rank in every if rank for name, digest in rank.items()}

    def load_sharded(self, path: Path, optimizer_steps: int) -> None:
        """Load what save_sharded wrote (any rank count that shards the same model); collective."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))  # in place
        set_state_dict(self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
        self.optimizer_steps = optimizer_steps
