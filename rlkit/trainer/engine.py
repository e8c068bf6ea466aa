"""The FSDP2 training engine: a model (a Hugging Face causal LM unless a factory builds another), sharded, with its
optimizer, LR schedule, gradient clipping, sharded checkpoints and full-weight export. No loss inside: an algorithm
(rlkit.trainer.actor, ppo_critic, sft, rw, dpo) hands `optimizer_step` its micro-batches and its loss function.

Every method that touches the model is collective: all ranks call it in the same order (FSDP all-gathers
parameters in forward). Ranks with fewer micro-batches than others run dummy ones that count for nothing.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from rlkit.config.schema.actor import LOGPROB_CHUNK_TOKENS, ActorConfig, OptimizerConfig
from rlkit.errors import StepError
from rlkit.models import ulysses
from rlkit.models.dtypes import DTYPES
from rlkit.models.packing import set_packing
from rlkit.models.source import build_causal_lm
from rlkit.trainer import out_of_memory
from rlkit.trainer.batch import MicroBatch
from rlkit.trainer.dist import all_reduce_sum, data_rank_world, init_sequence_parallel
from rlkit.trainer.head_logprobs import model_token_logprobs
from rlkit.trainer.sharded_load import build_sharded
from rlkit.trainer.skipped_steps import SkippedSteps
from rlkit.trials.recover_layout import FileDigest

T = TypeVar("T")  # an algorithm's micro-batch (packed tensors, or indices it packs itself)
ModelFactory = Callable[[ActorConfig, torch.device], nn.Module]  # unsharded, on the device (meta: the skeleton)
LossFn = Callable[[nn.Module, T], tuple[Tensor, int]]  # (loss averaged over its units, units that count)


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


def load_causal_lm(path: str, *, dtype: torch.dtype, attn_impl: str, disable_dropout: bool = False,
                   from_scratch: bool = False, meta: bool = False) -> nn.Module:
    """The causal LM at `path` (rlkit.models.source: dropout off, random weights, or the meta skeleton, as asked)."""
    return build_causal_lm(path, dtype=dtype, attn_impl=attention_implementation(attn_impl),
                           disable_dropout=disable_dropout, from_scratch=from_scratch, meta=meta)


def _actor_lm(config: ActorConfig, device: torch.device) -> nn.Module:
    return load_causal_lm(config.path, dtype=torch.float32, attn_impl=config.attn_impl, meta=device.type == "meta",
                          disable_dropout=config.disable_dropout, from_scratch=config.init_from_scratch)


def causal_lm(config: ActorConfig, device: torch.device) -> nn.Module:
    """The default model factory: the causal LM at config.path with float32 master weights (bf16/fp16 is the compute
    dtype through FSDP's mixed-precision policy), gradient checkpointing as configured."""
    return _ready(_actor_lm(config, device), config, device)


def lora_causal_lm(config: ActorConfig, device: torch.device) -> nn.Module:
    """The model factory of `actor.use_lora`: the float32 causal LM wrapped by peft (rlkit.trainer.lora.wrap_lora)
    BEFORE anything else (gradient checkpointing, the device, FSDP), so that only the adapter trains and every rank
    holds the same initial adapter."""
    from rlkit.trainer.lora import wrap_lora

    return _ready(wrap_lora(_actor_lm(config, device), config), config, device)


def value_head_model(config: ActorConfig, device: torch.device) -> nn.Module:
    """The model factory of a scalar head (rw's reward model, ppo's critic): the value model of config.path
    (rlkit.models.value_model: a fresh seeded head on a causal LM) in float32 master weights."""
    from rlkit.models.value_model import load_value_model

    model = load_value_model(config.path, dtype=torch.float32, attn_impl=attention_implementation(config.attn_impl),
                             disable_dropout=config.disable_dropout, from_scratch=config.init_from_scratch,
                             meta=device.type == "meta")
    return _ready(model, config, device)


def _ready(model: nn.Module, config: ActorConfig, device: torch.device) -> nn.Module:
    """Gradient checkpointing as configured (non-reentrant: the reentrant kind needs inputs that require grad, which a
    frozen LoRA base has not), then the device."""
    if config.gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
    return model.to(device)


def actor_model_factory(config: ActorConfig) -> ModelFactory:
    """The factory of the actor's model: the LoRA-wrapped causal LM with `use_lora`, the plain one otherwise."""
    return lora_causal_lm if config.use_lora else causal_lm


def checkpoint_of(config: ActorConfig, model_factory: ModelFactory) -> str | None:
    """The directory whose safetensors are exactly the factory's weights but those its build draws the same on every
    rank (the plain causal LM's; LoRA's base under peft's names and the value model's backbone, each rank drawing the
    adapter or a fresh head itself: rlkit.trainer.sharded_load), None for init_from_scratch (the build draws all) and
    any other factory (whose weights may be anything)."""
    known = model_factory in (causal_lm, lora_causal_lm, value_head_model)
    return config.path if known and not config.init_from_scratch else None


def param_dtype_of(config: ActorConfig) -> torch.dtype | None:
    """The compute dtype FSDP casts parameters to, None for float32 (no mixed precision)."""
    dtype = DTYPES[config.dtype]
    return None if dtype == torch.float32 else dtype


def token_logprobs(model: nn.Module, mb: MicroBatch, temperature: float, *, with_entropy: bool = False,
                   chunk_tokens: int = LOGPROB_CHUNK_TOKENS, entropy_grad: bool = False
                   ) -> tuple[Tensor, Tensor | None]:
    """[B, L-1] log-probs of each next token under `model` (logits / temperature), and optionally entropies (without
    gradient; with it when `entropy_grad`); through the output head `chunk_tokens` at a time
    (rlkit.trainer.head_logprobs; 0: full logits)."""
    return model_token_logprobs(model, mb.input_ids, mb.attention_mask, temperature=temperature,
                                chunk_tokens=chunk_tokens, with_entropy=with_entropy, entropy_grad=entropy_grad)


class TrainEngine:
    """One trained model on this rank's shard: its optimizer, LR schedule, clipping and checkpoints."""

    def __init__(self, config: ActorConfig, *, rank: int, world: int, device: torch.device,
                 total_optimizer_steps: int, model_factory: ModelFactory = causal_lm) -> None:
        self.config = config
        self.rank, self.world, self.device = rank, world, device
        self.model = build_sharded(lambda where: model_factory(config, where), device,  # no rank holds it whole
                                   param_dtype=param_dtype_of(config), checkpoint=checkpoint_of(config, model_factory))
        set_packing(self.model, config.mb_spec.packing)  # its forwards pack their rows (rlkit.models.packing)
        out_of_memory.watch(self.model, self)  # what ran, for the message of an out-of-memory (rlkit.trainer.loop)
        layout = init_sequence_parallel(config.fsdp.ulysses_sp_size)
        if layout is not None:
            ulysses.enable(self.model)  # its packed rows split over the sp group (rlkit.models.ulysses)
            if rank == 0:
                print(f"rlkit train: Ulysses sequence parallelism: {world} ranks in sp groups of {layout.size} "
                      f"(data-parallel degree {layout.data_world})", flush=True)
        self.optimizer = self._make_optimizer(config.optimizer)
        self.total_optimizer_steps = max(1, total_optimizer_steps)
        self.optimizer_steps = 0
        self.skipped = SkippedSteps()  # optimizer steps skipped for a non-finite gradient norm

    @property
    def data_rank_world(self) -> tuple[int, int]:
        """(which share, how many shares) of a batch this rank trains: its sp group's under sequence parallelism."""
        return data_rank_world(self.rank, self.world)

    def _make_optimizer(self, cfg: OptimizerConfig) -> torch.optim.Optimizer:
        params = [p for p in self.model.parameters() if p.requires_grad]
        if cfg.type == "adam":
            return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                     weight_decay=cfg.weight_decay)
        if cfg.type == "sgd":
            return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        raise ValueError(f"unknown optimizer type {cfg.type!r}")

    def optimizer_step(self, micro_batches: Iterable[T], loss_fn: LossFn[T], local_units: float) -> dict[str, float]:
        """One optimizer step over this rank's `micro_batches` (the same count on every rank); collective.

        `loss_fn(model, mb)` runs the forward and returns the loss averaged over its units (tokens, pairs, ...) and
        their count. Each loss is weighted so that the gradient is the mean over the units of every rank
        (`local_units` of this rank, summed over ranks here): FSDP averages gradients over ranks, hence the factor
        `world`; under sequence parallelism the ranks of an sp group hold the same units, counted once
        (all_reduce_sum), and their gradients add up to the group's one. Then clipping, the LR of the schedule, the
        step. Returns the gradient norm and the LR.
        """
        self.model.train()
        global_units = all_reduce_sum([float(local_units)])[0]
        self.optimizer.zero_grad(set_to_none=True)
        for mb in micro_batches:
            loss, units = loss_fn(self.model, mb)
            scale = units * self.world / max(1.0, global_units)
            out_of_memory.now(self, out_of_memory.BACKWARD)
            (loss * scale).backward()
        out_of_memory.now(self, out_of_memory.OPTIMIZER)
        grad_norm = self._clip_and_step()
        out_of_memory.done()
        return {"grad_norm": grad_norm, "lr": self.optimizer.param_groups[0]["lr"]}

    def probe_logprobs(self, ids: list[int]) -> list[float]:
        """Log-probs of tokens 1..n of `ids` given their prefix at temperature 1 (the weight fingerprint);
        collective, computed exactly as for the servers' side of the check."""
        from rlkit.weights.fingerprint import trainer_probe_logprobs

        return trainer_probe_logprobs(self.model, ids)

    def _clip_and_step(self) -> float:
        cfg = self.config.optimizer
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.gradient_clipping if cfg.gradient_clipping > 0
                                              else float("inf"))
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        if not math.isfinite(float(norm)):  # every rank holds the same all-reduced norm, so all of them skip
            self.optimizer.zero_grad(set_to_none=True)  # clipping by a NaN norm made every gradient NaN
            self.skipped.skip(float(norm), announce=self.rank == 0)  # counted (a metric); 5 in a row: StepError
            return float(norm)
        self.skipped.taken()
        if float(norm) == 0.0:  # nothing to learn from this batch: AdamW's moments alone would move every weight
            self.skipped.zero(announce=self.rank == 0)  # (rlkit.trainer.skipped_steps); the schedule counts it
            self.optimizer.zero_grad(set_to_none=True)
            self.optimizer_steps += 1
            return 0.0
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

    def _checkpoint_options(self, *, loading: bool = False) -> Any:
        """What a recover checkpoint holds: with LoRA the trainable (adapter) parameters and their optimizer state
        only; the frozen base is actor.path's, reloaded from there (on a real model it is most of the bytes). Loading
        sets only those (not strict: the base is not in the state dict; dcp.load has already refused a checkpoint
        that lacks one of them)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        if not self.config.use_lora:
            return None
        return StateDictOptions(ignore_frozen_params=True, strict=not loading)

    def save_sharded(self, path: Path) -> dict[str, FileDigest]:
        """Every rank writes its shards of the model and optimizer as one file (rlkit.trainer.rank_files), front to
        back; collective. Returns, on every rank, the size and checksum of every file any rank wrote, computed while
        writing."""
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import get_state_dict

        from rlkit.trainer import rank_files

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self._checkpoint_options())
        tensors, values = rank_files.flatten(model_sd, optim_sd)
        path.mkdir(parents=True, exist_ok=True)
        file = path / rank_files.rank_file_name(self.rank, self.world)
        mine = {str(file): rank_files.write_rank_file(file, rank_files.pieces_of(tensors), values, rank=self.rank,
                                                      world=self.world)}
        if not (dist.is_available() and dist.is_initialized()):
            return mine
        every: list[dict[str, FileDigest] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        return {name: digest for rank in every if rank for name, digest in rank.items()}

    def load_sharded(self, path: Path, optimizer_steps: int,
                     expected: Mapping[str, FileDigest] | None = None) -> None:
        """Load what save_sharded wrote; collective. With the world it was written by, each rank reads its own file
        in one pass straight into its tensors, checking it against `expected` (size and checksum by path: the
        manifest's, recover.manifest_digests) on the way; with another world, the rows each rank needs from every
        file, checked whole first. DamagedCheckpoint on every rank when a file does not match (the weights then
        hold some of its bytes: load another checkpoint). `expected` None: the caller has checked the files.

        A checkpoint of older rlkit versions (torch.distributed.checkpoint; any world) loads through DCP, verified
        by the caller (recover.latest_valid checks such files itself). A LoRA engine loads its trainable parameters
        only, from an adapter-only checkpoint or from one that holds the whole model too."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        from rlkit.trainer import rank_files

        # before anything is read: get_state_dict creates the optimizer state that the files fill in place
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self._checkpoint_options())
        if not rank_files.rank_files(path):
            self._load_distcp(path, model_sd, optim_sd)
        else:
            tensors, _values = rank_files.flatten(model_sd, optim_sd)
            self._set_values(_agreed(lambda: self._read_rank_files(path, tensors, expected)), optim_sd)
        self.optimizer_steps = optimizer_steps

    def _read_rank_files(self, path: Path, tensors: dict[str, Tensor],
                         expected: Mapping[str, FileDigest] | None) -> dict[str, Any]:
        from rlkit.trainer import rank_files, rank_gather

        targets = {piece.name: piece for piece in rank_files.pieces_of(tensors)}
        own = path / rank_files.rank_file_name(self.rank, self.world)
        if own.is_file():
            digest = None if expected is None else rank_files.recorded(expected, own)
            try:
                return rank_files.read_rank_file(own, targets, digest)
            except rank_files.LayoutChanged:
                pass  # written for other shards: nothing read yet, gather the rows instead
        return rank_gather.gather_rows(path, targets, expected)

    def _set_values(self, meta: Mapping[str, Any], optim_sd: dict[str, Any]) -> None:
        """The optimizer's param groups (lr, betas, ...) and non-tensor state as saved; the tensors are in place."""
        saved = meta["param_groups"]
        if [g["params"] for g in saved] != [g["params"] for g in optim_sd["param_groups"]]:
            raise StepError("the recover checkpoint's optimizer param groups hold other parameters than this model's")
        for live, group in zip(self.optimizer.param_groups, saved, strict=True):
            for key, value in group.items():
                if key != "params":
                    live[key] = tuple(value) if isinstance(live.get(key), tuple) else value
        for name, value in meta["optim_values"].items():
            fqn, key = name.rsplit("/", 1)
            optim_sd["state"][fqn][key] = value

    def _load_distcp(self, path: Path, model_sd: dict[str, Any], optim_sd: dict[str, Any]) -> None:
        """A torch.distributed.checkpoint of older rlkit versions, in place (DCP refuses one that lacks a tensor)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
        set_state_dict(self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                       options=self._checkpoint_options(loading=True))


def _agreed(read: Callable[[], T]) -> T:
    """Run this rank's part of a load and agree on its outcome with every rank (a rank that failed alone would leave
    the others waiting in their next collective): the first damage found raises DamagedCheckpoint everywhere, any
    other failure StepError."""
    import torch.distributed as dist

    from rlkit.trainer.rank_files import DamagedCheckpoint

    result: T | None = None
    problem: tuple[bool, str] | None = None
    try:
        result = read()
    except DamagedCheckpoint as exc:
        problem = (True, str(exc))
    except Exception as exc:  # whatever it is, every rank must hear of it rather than wait
        problem = (False, f"{type(exc).__name__}: {exc}")
    problems = [problem]
    if dist.is_available() and dist.is_initialized():
        problems = [None] * dist.get_world_size()
        dist.all_gather_object(problems, problem)
    found = [(rank, p) for rank, p in enumerate(problems) if p is not None]
    damaged = [f"rank {rank}: {text}" for rank, (is_damage, text) in found if is_damage]
    if damaged:
        raise DamagedCheckpoint("; ".join(damaged))
    if found:
        raise StepError("the recover checkpoint cannot be loaded: "
                        + "; ".join(f"rank {rank}: {text}" for rank, (_, text) in found))
    assert result is not None
    return result
