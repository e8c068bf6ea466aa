"""Ulysses sequence parallelism for a packed row (issue 46, part 4): each rank of an sp group holds 1/sp of the row's
tokens, and attention exchanges heads for sequence by all-to-all so that every rank attends over the whole row for
heads/sp of the heads.

Why through transformers' attention registry: a model built with `attn_implementation="rlkit_ulysses"` calls
`ulysses_attention` from every attention layer with its query, key and value after the rotary embedding (computed
from each rank's own slice of `position_ids`), so no model code is patched and every model family whose attention
layers go through ALL_ATTENTION_FUNCTIONS alike is covered; rlkit.config.schema.actor.ULYSSES_MODEL_TYPES names
those checked (submit refuses others). Outside a sequence-parallel forward (a padded batch, the packing probe, the
weight fingerprint) the
same implementation is torch's sdpa, as transformers runs it.

Inside, each sample of the packed row (found from the whole row's `position_ids`, restarting at 0) runs torch's sdpa
with `is_causal`: no [N, N] mask is built, so memory grows with the row's tokens, not their square. The row's slice
rides in a forward keyword (`rlkit_ulysses`) that transformers hands every attention call unchanged, so gradient
checkpointing's recompute in backward sees it too. KV heads fewer than sp (sp a multiple of them) are repeated
first, as verl does, so that every rank gets the KV head its query heads read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlkit.models.packing import SEQUENCE_PARALLEL_ATTENTION, PackedRows

ATTENTION = SEQUENCE_PARALLEL_ATTENTION
KEYWORD = "rlkit_ulysses"  # the forward keyword that carries a RowSlice to every attention call
_FLAG = "_rlkit_ulysses"  # on a model object: its packed forwards run sequence parallel
_in_forward = False  # a sequence-parallel forward is building its masks: none is needed


@dataclass(frozen=True)
class RowSlice:
    """This rank's slice of a packed row (padded to a multiple of sp) and what its attention needs of the rest."""

    input_ids: Tensor  # [1, N/sp]
    position_ids: Tensor  # [1, N/sp]
    targets: Tensor  # [1, N/sp]: the next token of each position (0 past the row's end)
    segments: tuple[tuple[int, int], ...]  # (start, end) of each sample in the whole padded row
    group: dist.ProcessGroup
    size: int
    length: int  # real tokens of the row (before padding)

    def gather(self, values: Tensor) -> Tensor:
        """[1, length-1] next-token values of the whole row from each rank's [1, N/sp]; differentiable (each rank's
        gradient flows to its own slice: every rank of the group computes the same loss from the gathered row)."""
        whole = _GatherSlices.apply(values.contiguous(), self.group, self.size)
        return whole[:, : self.length - 1]


def slice_row(rows: PackedRows, group: dist.ProcessGroup, size: int, local_rank: int) -> RowSlice:
    """This rank's slice of `rows`' packed row: padded at the end (a sample of its own, cut off by gather) to a
    multiple of `size`."""
    ids, positions = rows.input_ids, rows.position_ids
    length = ids.shape[1]
    pad = -length % size
    filler = torch.arange(pad, device=ids.device)[None]
    ids = torch.cat([ids, torch.zeros_like(filler)], dim=1)
    positions = torch.cat([positions, filler], dim=1)
    targets = torch.cat([ids[:, 1:], ids.new_zeros((1, 1))], dim=1)
    starts = (positions[0] == 0).nonzero().flatten().tolist()
    ends = [*starts[1:], ids.shape[1]]
    local = slice(local_rank * (ids.shape[1] // size), (local_rank + 1) * (ids.shape[1] // size))
    return RowSlice(ids[:, local], positions[:, local], targets[:, local], tuple(zip(starts, ends, strict=True)),
                    group, size, length)


@contextlib.contextmanager
def sequence_parallel_forward() -> Iterator[None]:
    """For the forward in the block: the masks transformers builds before the layers are skipped (each rank's
    slice would get one of its own; the attention below builds none)."""
    global _in_forward
    _in_forward = True
    try:
        yield
    finally:
        _in_forward = False


def enable(model: nn.Module) -> None:
    """Make `model` (a Hugging Face model, through a peft wrapper too) attend through ulysses_attention, and its
    packed forwards run sequence parallel (rlkit.trainer.head_logprobs)."""
    from transformers import PreTrainedModel

    register()
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            module.set_attn_implementation(ATTENTION)
            break
    else:
        raise ValueError(f"{type(model).__name__} is not a Hugging Face model: ulysses_sp_size needs one")
    setattr(model, _FLAG, True)


def enabled(model: nn.Module) -> bool:
    return bool(getattr(model, _FLAG, False))


@contextlib.contextmanager
def unsplit(model: nn.Module) -> Iterator[None]:
    """In the block, `model`'s forwards run whole (padded rows: every rank of the sp group runs all of them)."""
    setattr(model, _FLAG, False)
    try:
        yield
    finally:
        setattr(model, _FLAG, True)


def shared_gradient(values: Tensor, size: int) -> Tensor:
    """`values` with 1/size of their gradient: every rank of an sp group computed them whole, and FSDP adds the
    group's gradients up."""
    return values if size == 1 else values.detach() + (values - values.detach()) / size


def register() -> None:
    """The attention function and its mask function under ATTENTION in transformers' registries (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def mask(*args: Any, **kwargs: Any) -> Any:
        return None if _in_forward else sdpa_mask(*args, **kwargs)

    AttentionInterface.register(ATTENTION, ulysses_attention)
    AttentionMaskInterface.register(ATTENTION, mask)


def ulysses_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None, **kwargs: Any) -> tuple[Tensor, None]:
    """[1, N/sp, heads, head_dim] from this rank's [1, heads, N/sp, head_dim]: heads for sequence by all-to-all,
    causal sdpa per sample over the whole row, back by all-to-all. Plain sdpa without a RowSlice."""
    piece: RowSlice | None = kwargs.pop(KEYWORD, None)
    if piece is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    size = piece.size
    if query.shape[1] % size or (key.shape[1] % size and size % key.shape[1]):  # submit refuses these
        raise ValueError(f"{query.shape[1]} attention / {key.shape[1]} KV heads do not split over {size} sp ranks")
    if key.shape[1] % size:  # fewer KV heads than sp: each repeated so that every rank gets its own
        key = key.repeat_interleave(size // key.shape[1], dim=1)
        value = value.repeat_interleave(size // value.shape[1], dim=1)
    q, k, v = (_heads_to_sequence(t, piece) for t in (query, key, value))
    # grouped-query attention: sdpa reads each KV head for its query heads (enable_gqa, repeat_interleave's order)
    # instead of a repeated copy, which autograd would keep for backward in every layer: at 4:2 heads on 2 ranks
    # that copy was a third of the attention's saved memory
    gqa = k.shape[1] != q.shape[1]
    p = dropout if module.training else 0.0
    outs = [torch.nn.functional.scaled_dot_product_attention(
        q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], dropout_p=p, is_causal=True, scale=scaling,
        enable_gqa=gqa) for start, end in piece.segments]
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return _sequence_to_heads(out, piece).transpose(1, 2).contiguous(), None


def _heads_to_sequence(x: Tensor, piece: RowSlice) -> Tensor:
    """[1, H, N/sp, D] -> [1, H/sp, N, D]: head group j to rank j, slices in rank order."""
    _, heads, length, width = x.shape
    sent = x[0].reshape(piece.size, heads // piece.size, length, width)
    got = _AllToAll.apply(sent.contiguous(), piece.group)
    return got.transpose(0, 1).reshape(1, heads // piece.size, piece.size * length, width)


def _sequence_to_heads(x: Tensor, piece: RowSlice) -> Tensor:
    """[1, H/sp, N, D] -> [1, H, N/sp, D]: the inverse of _heads_to_sequence."""
    _, heads, length, width = x.shape
    sent = x[0].reshape(heads, piece.size, length // piece.size, width).transpose(0, 1)
    got = _AllToAll.apply(sent.contiguous(), piece.group)
    return got.reshape(1, heads * piece.size, length // piece.size, width)


class _AllToAll(torch.autograd.Function):
    """all_to_all_single along dim 0 in equal parts; its gradient is the same exchange backwards. Both buffers
    contiguous: the exchange copies raw memory, and empty_like keeps a strided gradient's strides."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: dist.ProcessGroup) -> Tensor:
        ctx.group = group
        return _exchange(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _exchange(grad, ctx.group), None


def _exchange(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dist.all_to_all_single(out, x, group=group)
    return out


class _GatherSlices(torch.autograd.Function):
    """[1, n] per rank -> [1, n * size] in rank order; backward keeps this rank's part of the gradient (every rank
    of the group computes the same loss from the whole, so the sum over ranks is the loss's gradient once)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: dist.ProcessGroup, size: int) -> Tensor:
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x, group=group)
        ctx.rank, ctx.width = dist.get_rank(group), x.shape[1]
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return grad[:, ctx.rank * ctx.width:(ctx.rank + 1) * ctx.width].contiguous(), None, None
