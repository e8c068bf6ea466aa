"""A trainer rank out of GPU (or host) memory: one error that says at which step, in which pass, how big the
micro-batch was, what the GPU held, and which of the job's keys to turn with their values now, instead of a bare
traceback.

It is fatal (exit NO_RETRY_EXIT, which the job script never retries) when the memory was this rank's own use, because
a restart brings the same data back to the same step: the trainer resumes from the last recover checkpoint and
replays the steps since then in the same order. sft, rw and dpo take each step's rows from the step number and the
seed; grpo, ppo, opmd and distill draw prompts from a seeded stream whose trained positions the checkpoint records, so
the same prompts come back, their completions sampled again from the same weights with the same seeds (each request's
seed derives from its prompt's position). A retry would redo those steps and fail again, recover.retries times (each
redone step resets the supervisor's crash-loop test); only a changed key helps (`rlkit resume TRIAL key=value`).
Two causes a restart does fix leave it retryable, read from torch's own figures in its message: memory held by other
processes (a trainer of the job before still exiting on the node), and a fragmented allocator (torch held, reserved
but unallocated, at least what it tried to allocate: a fresh process starts unfragmented). Without the figures (host
memory, another message) it is fatal.

Only torch's own errors are read: rlkit's errors quote the servers' answers, and a server out of memory is the
server's failure (rlkit.servers.startup_failure), not this rank's.

What ran is noted cheaply as it runs: every forward of a trained model (and of a frozen reference) passes a pre-hook
(`watch`) that keeps references to its input tensors (no copy, no device sync), and the engine notes its backward and
its optimizer step (`now`, `done`). The figures are computed only when the error is built, on the host.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.cuda_oom import oom_figures
from rlkit.errors import NO_RETRY_EXIT, StepError

FORWARD, NO_GRAD, BACKWARD, OPTIMIZER = "forward", "forward without gradient", "backward", "optimizer step"
REFERENCE = "reference"  # the owner of a frozen reference model's forwards
# the texts of an allocation failure that torch raises as a plain RuntimeError (alloc_cpu.cpp; a CUDA runtime call)
CPU_WORDS = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")
GPU_WORDS = ("CUDA out of memory", "CUDA error: out of memory")
_INPUTS = ("input_ids", "attention_mask", "position_ids")


@dataclass
class Pass:
    """What this rank's trainer ran last: whose model (a TrainEngine, or REFERENCE), which phase, its inputs."""

    owner: object
    phase: str
    inputs: dict[str, Tensor] = field(default_factory=dict)
    sp_slice: bool = False  # the inputs are this rank's slice of a row split by sequence parallelism


class _Last:
    """The one record of a trainer process (one thread trains; the rollout threads run no model)."""

    run: Pass | None = None


LAST = _Last()


def now(owner: object, phase: str) -> None:
    """`owner` enters `phase`; a backward keeps the inputs of the forward before it (its micro-batch)."""
    last = LAST.run
    if phase == BACKWARD and last is not None and last.owner is owner:
        LAST.run = Pass(owner, phase, last.inputs, last.sp_slice)
    else:
        LAST.run = Pass(owner, phase)


def done() -> None:
    """Nothing runs that the record would describe (an optimizer step is over, a forward without gradient ended)."""
    LAST.run = None


def watch(model: nn.Module, owner: object) -> None:
    """Note every forward of `model` as `owner`'s; one without gradient is forgotten once it returns."""
    from rlkit.models.ulysses import KEYWORD

    def before(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        inputs = {k: v for k, v in kwargs.items() if k in _INPUTS and isinstance(v, Tensor)}
        if args and isinstance(args[0], Tensor):
            inputs.setdefault("input_ids", args[0])
        LAST.run = Pass(owner, FORWARD if torch.is_grad_enabled() else NO_GRAD, inputs, KEYWORD in kwargs)

    def after(_module: nn.Module, _args: tuple[Any, ...], _kwargs: dict[str, Any], _out: Any) -> None:
        if not torch.is_grad_enabled() and LAST.run is not None and LAST.run.owner is owner:
            done()

    # first: before FSDP's own pre-forward, whose all-gather of the parameters may be what runs out
    model.register_forward_pre_hook(before, with_kwargs=True, prepend=True)
    model.register_forward_hook(after, with_kwargs=True)


def memory_kind(exc: BaseException) -> str | None:
    """"GPU" or "CPU" when `exc` (or an exception it was raised from) is torch's allocation failure; else None. The
    words count only in a RuntimeError (torch raises its allocation failures as one), never in rlkit's own errors,
    which may quote a server's answer."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, torch.OutOfMemoryError):
            return "GPU"
        if isinstance(current, RuntimeError):
            text = str(current)
            if any(words in text for words in CPU_WORDS):
                return "CPU"
            if any(words in text for words in GPU_WORDS):
                return "GPU"
        current = current.__cause__ or current.__context__
    return None


class OutOfMemory(StepError):
    """A trainer rank ran out of memory: fatal (NO_RETRY_EXIT) unless `retry_reason` says why a restart may fix it
    (see the module docstring). `status`: the one line progress.json gets for `rlkit status`."""

    def __init__(self, message: str, status: str, retry_reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.retry_reason = retry_reason
        self.exit_code = 1 if retry_reason else NO_RETRY_EXIT


def retry_reason(text: str) -> str:
    """Why a restart may fix the out-of-memory torch described in `text` (its CUDA message's figures); "" when
    nothing says so (the memory was this rank's own, or no figures)."""
    figures = oom_figures(text)
    others = figures.others()
    if others is not None and figures.total is not None and figures.others_held_memory():
        gib = 1024**3
        return (f"other processes held {others / gib:.1f} GiB of the GPU's {figures.total.bytes / gib:.1f} GiB "
                "(a restart may find it free)")
    tried, reserved = figures.tried, figures.reserved
    if tried is not None and reserved is not None and reserved.bytes >= tried.bytes:
        return ("torch held more reserved but unallocated memory than it tried to allocate (fragmentation: a "
                "fresh process starts without it; launcher.trainer_env_vars="
                "'PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True' avoids it)")
    return ""


@contextmanager
def named(config: ExperimentConfig, step: int | None, engines: Callable[[], Mapping[str, object]]) -> Iterator[None]:
    """Turn an allocation failure inside the block into OutOfMemory (`step` None: building the trainer); any other
    error passes untouched."""
    try:
        yield
    except Exception as exc:
        kind = memory_kind(exc)
        if kind is None or isinstance(exc, OutOfMemory):
            raise
        raise out_of_memory(exc, kind, config, step, engines()) from exc


def out_of_memory(exc: BaseException, kind: str, config: ExperimentConfig, step: int | None,
                  engines: Mapping[str, object]) -> OutOfMemory:
    """The error of `exc` (an allocation failure of `kind`) at `step` (None: building the trainer), `engines` by
    name (the loop's: which one's model ran)."""
    last, LAST.run = (LAST.run if step is not None else None), None
    names = {id(engine): name for name, engine in engines.items()}
    name = "actor" if last is None or last.owner is REFERENCE else names.get(id(last.owner), "actor")
    whose = "the reference model's" if last is not None and last.owner is REFERENCE else f"the {name}'s"
    if step is None:
        where = "while building the trainer's models"
    elif last is None:
        where = f"at step {step}, outside a model's forward or backward (a weight push or a checkpoint)"
    else:
        where = f"at step {step}, in {whose} {last.phase}"
    rank = dist.get_rank() if dist.is_initialized() else 0
    lines = [f"out of {kind} memory {where}, on trainer rank {rank} ({socket.gethostname()})"]
    batch = figures(last.inputs) if last is not None and last.inputs else None
    if batch is not None:
        lines.append(f"  micro-batch: {describe(batch)}"
                     + (" (this rank's slice of it under sequence parallelism)" if last and last.sp_slice else ""))
    said = ". ".join((str(exc).strip().splitlines() or [type(exc).__name__])[0].split(". ")[:2])
    lines.append(f"  memory: {memory(kind)}{said[:200]}")
    if step is None:  # rlkit.trainer.sharded_load: each rank holds its float32 shards; rank 0 the model on the host
        lines.append("  each trainer GPU holds its share of the float32 weights (4 bytes a parameter over the trainer "
                     "GPUs), and rank 0's host the whole model while it loads unless each rank reads its own rows "
                     "of the checkpoint (rank 0's log says why not when it does not):")
        lines.append(f"    allocation_mode={config.allocation_mode}: more trainer GPUs (fsdp:dN) make each share "
                     "smaller")
        if kind == "CPU":
            lines.append(f"    launcher.trainer_mem_per_gpu={config.launcher.trainer_mem_per_gpu}: the host memory "
                         "(MB) per trainer GPU asked of Slurm")
    else:
        lines.append("  keys that lower it, with their values now:")
        lines += [f"    {knob}" for knob in knobs(config, "critic" if name == "critic" else "actor", kind, batch)]
    if step is not None and last is None:
        lines.append(f"    actor.weight_chunked_mem_mb={config.actor.weight_chunked_mem_mb}: a weight push's buckets "
                     "on trainer rank 0 (xccl)")
    reason = retry_reason(str(exc)) if kind == "GPU" else ""
    if reason:
        lines.append(f"  retried: {reason}")
    else:
        lines.append("  not retried: a restart replays the same data into the same step; change a key above and run "
                     "`rlkit resume TRIAL key=value`")
    return OutOfMemory("\n".join(lines), f"out of {kind} memory {where} (the trainer's log names the keys to turn)",
                       reason)


@dataclass(frozen=True)
class Figures:
    """A forward's micro-batch: its sequences, their tokens, the longest, and what it counts against
    mb_spec.max_tokens_per_mb (padded rows: rows x the longest row; packed: the real tokens)."""

    sequences: int
    tokens: int
    longest: int
    budget: int
    packed: bool


def figures(inputs: Mapping[str, Tensor]) -> Figures | None:
    """The Figures of a forward's inputs (padded rows with their mask, or one packed row whose position ids restart
    at each sequence), read on the host; None when they cannot be read."""
    ids, mask, positions = (inputs.get(k) for k in _INPUTS)
    try:
        if mask is not None:
            lengths = mask.detach().to("cpu").sum(-1).reshape(-1)
            budget = ids.numel() if ids is not None else mask.numel()
            return Figures(lengths.numel(), int(lengths.sum()), int(lengths.max()), budget, False)
        if positions is not None:
            flat = positions.detach().to("cpu").reshape(-1)
            return Figures(int((flat == 0).sum()), flat.numel(), int(flat.max()) + 1, flat.numel(), True)
        if ids is not None:
            return Figures(ids.shape[0], ids.numel(), ids.shape[-1], ids.numel(), False)
    except Exception:  # the figures are a help; the error must come whatever they meet
        return None
    return None


def describe(batch: Figures) -> str:
    padding = "" if batch.packed or batch.budget == batch.tokens else f" ({batch.budget} with padding)"
    plural = "s" if batch.sequences != 1 else ""
    return (f"{batch.sequences} sequence{plural}{' packed' if batch.packed else ''}, {batch.tokens} tokens{padding}, "
            f"the longest {batch.longest}")


def memory(kind: str) -> str:
    """The GPU's peak allocation and size (nothing for host memory or without CUDA), before torch's own words."""
    if kind != "GPU" or not torch.cuda.is_available():
        return ""
    try:
        device = torch.cuda.current_device()
        peak, total = torch.cuda.max_memory_allocated(device), torch.cuda.get_device_properties(device).total_memory
    except Exception:  # a broken CUDA context: torch's words still say it
        return ""
    gib = 1024**3
    return f"peak {peak / gib:.1f} GiB allocated by torch of GPU {device}'s {total / gib:.1f} GiB; "


def knobs(config: ExperimentConfig, name: str, kind: str, batch: Figures | None) -> list[str]:
    """The keys that lower a trainer rank's memory, `name`'s (actor or critic), each with its value now and what to
    set (from the failed micro-batch's figures when known)."""
    section = config.critic if name == "critic" else config.actor
    cap = section.mb_spec.max_tokens_per_mb
    if batch is not None and batch.sequences == 1:
        split = "lowering it cannot help here: the micro-batch was one sequence (the keys below can)"
    elif batch is not None:
        split = f"fewer tokens per micro-batch, e.g. {max(batch.longest, batch.budget // 2)} (this one counted " \
                f"{batch.budget})"
    else:
        split = "fewer tokens per micro-batch"
    out = [f"{name}.mb_spec.max_tokens_per_mb={cap or 'null'}: {split}"]
    on = section.gradient_checkpointing
    out.append(f"{name}.gradient_checkpointing={str(on).lower()}: " + (
        "already on" if on else "true recomputes activations in backward instead of keeping them"))
    if name == "actor":
        chunk = config.actor.logprob_chunk_tokens
        out.append(f"actor.logprob_chunk_tokens={chunk}: " + (
            "e.g. 1024 runs the output head that many tokens at a time instead of all logits at once" if not chunk
            else "the output head's logits are this many tokens x vocabulary floats; lower saves a little"))
    sp = section.fsdp.ulysses_sp_size
    out.append(f"{name}.fsdp.ulysses_sp_size={sp}: " + (
        "2 or more split each packed sequence over that many trainer ranks (grpo, opmd, sft, ppo)" if sp == 1
        else "larger splits each packed sequence over more trainer ranks"))
    if kind == "CPU":
        out.append(f"launcher.trainer_mem_per_gpu={config.launcher.trainer_mem_per_gpu}: the host memory (MB) per "
                   "trainer GPU asked of Slurm")
    out.append(f"allocation_mode={config.allocation_mode}: more trainer GPUs (fsdp:dN) shard the weights, gradients "
               "and optimizer state thinner")
    return out
