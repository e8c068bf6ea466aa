"""sdpa over a packed row without the dense block-diagonal mask (issue 46, part 1).

Transformers runs sdpa over a packed row [1, N] with one dense [N, N] mask: quadratic in all of the row's tokens, so
16 short sequences cost 16x the attention of their padded batch (measured: the CPU agent demo's packed step 5x
slower than padded). Here, inside attention only, the packed row's queries, keys and values are laid out again as the
right-padded [B, Lmax] batch they came from and run through sdpa's causal kernel without a mask (with right padding
a real query only sees real keys), and the real tokens' outputs go back in packed order. Attention then costs what it
costs padded (less: the causal kernel skips the blocks above the diagonal), while the linear layers and the head
still see only real tokens. Not grouped by length: sdpa's CPU kernel blocks its sums by the padded length, so a
group of another length gives results ~5e-7 off, which one AdamW step amplified past tests/unit/trainer/
test_packed_steps.py's 1e-5 (the critic's score.bias, 1.2e-5); at the padded length the outputs are bitwise padded's.

How it plugs in: a model packing with sdpa gets the attention implementation PACKED_SDPA (registered with
transformers' AttentionInterface and AttentionMaskInterface). Its mask function builds no mask during a packed call
(`packed_call`) and is sdpa's own otherwise; its attention function runs as above when the call's position_ids were
registered by `packed_call`, and is sdpa's own otherwise, so a padded forward is exactly today's. The layout is keyed
by the position_ids tensor itself, which transformers hands to every layer and gradient checkpointing keeps for the
recompute in backward (after `packed_call` has returned).
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

PACKED_SDPA = "rlkit_packed_sdpa"

_IN_PACKED_CALL = contextvars.ContextVar("rlkit_packed_call", default=False)
_LAYOUTS: dict[int, tuple[weakref.ref[Tensor], PaddedLayout]] = {}  # id(position_ids) -> its padded layout


@dataclass(frozen=True)
class PaddedLayout:
    """Where a packed row's tokens sit in the right-padded batch of its sequences."""

    gather: Tensor  # [B, Lmax]: the packed position of each padded position (0 at padding)
    real: Tensor  # [N]: the flat padded positions (row x Lmax + column) of the real tokens, in packed order


def padded_layout(lengths: list[int], device: torch.device) -> PaddedLayout:
    """The layout of packed sequences of `lengths` (in packed order)."""
    sizes = torch.tensor(lengths, device=device)
    positions = torch.arange(max(lengths), device=device).expand(len(lengths), max(lengths))
    valid = positions < sizes[:, None]
    gather = torch.where(valid, (torch.cumsum(sizes, 0) - sizes)[:, None] + positions, 0)
    return PaddedLayout(gather, valid.flatten().nonzero().flatten())


def packed_lengths(position_ids: Tensor) -> list[int]:
    """The lengths of the sequences of a packed [1, N] row: a new one wherever a position does not follow the one
    before by 1 (transformers' own rule, masking_utils.find_packed_sequence_indices)."""
    positions = position_ids[0]
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[1:] = positions[1:] != positions[:-1] + 1
    bounds = [*starts.nonzero().flatten().tolist(), positions.numel()]
    return [end - start for start, end in itertools.pairwise(bounds)]


@contextlib.contextmanager
def packed_call(position_ids: Tensor) -> Iterator[None]:
    """Around a model's forward over the packed row with these position_ids: no dense mask is built and attention
    runs on the padded layout (here and in the backward's recompute, while the tensor lives)."""
    key = id(position_ids)
    layout = padded_layout(packed_lengths(position_ids), position_ids.device)
    _LAYOUTS[key] = (weakref.ref(position_ids, lambda _ref: _LAYOUTS.pop(key, None)), layout)
    token = _IN_PACKED_CALL.set(True)
    try:
        yield
    finally:
        _IN_PACKED_CALL.reset(token)


def _layout_of(position_ids: Tensor | None) -> PaddedLayout | None:
    entry = _LAYOUTS.get(id(position_ids)) if position_ids is not None else None
    return entry[1] if entry is not None and entry[0]() is position_ids else None


def _padded_sdpa(query: Tensor, key: Tensor, value: Tensor, layout: PaddedLayout, *, scaling: float | None,
                 dropout: float) -> Tensor:
    """[1, N, H, D] attention outputs of packed q [1, H, N, D], k and v [1, Hkv, N, D], through sdpa's causal kernel
    on the padded layout. index_select throughout: its backward adds rows (index_add_), several times faster on the
    CPU than the accumulating index_put_ that advanced indexing's backward runs."""
    rows, length = layout.gather.shape
    q, k, v = (t[0].index_select(1, layout.gather.flatten()).unflatten(1, (rows, length)).transpose(0, 1)
               for t in (query, key, value))  # [B, H, Lmax, D]
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scaling,
                                                           enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).flatten(0, 1).index_select(0, layout.real)[None]


def _attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
               **kwargs: Any) -> tuple[Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layout = _layout_of(kwargs.get("position_ids")) if attention_mask is None and query.shape[0] == 1 else None
    if layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    dropout = float(kwargs.get("dropout", 0.0)) if module.training else 0.0
    return _padded_sdpa(query, key, value, layout, scaling=kwargs.get("scaling"), dropout=dropout), None


def _mask(**kwargs: Any) -> Tensor | None:
    from transformers.masking_utils import sdpa_mask

    return None if _IN_PACKED_CALL.get() else sdpa_mask(**kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_SDPA, _attention)
    AttentionMaskInterface.register(PACKED_SDPA, _mask)


def install(model: nn.Module) -> bool:
    """Give `model` (sdpa, every layer full attention) this packed attention; False when it cannot take it: another
    implementation, sliding-window layers (the causal kernel would ignore the window), or a model that does not
    dispatch attention through transformers' interface."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or getattr(config, "sub_configs", None):
        return False
    if getattr(config, "sliding_window", None) and any(
            kind != "full_attention" for kind in getattr(config, "layer_types", None) or ["sliding_attention"]):
        return False
    setter = getattr(model, "set_attn_implementation", None)
    if not callable(setter):
        return False
    _register()
    setter(PACKED_SDPA)
    return bool(getattr(config, "_attn_implementation", None) == PACKED_SDPA)
