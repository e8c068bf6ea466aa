"""Right-padded rows run as one packed row (issue 46, part 1): no compute on padding.

The real tokens of a [B, L] right-padded batch are concatenated into [1, N] with `position_ids` restarting at 0 for
each row and no attention mask. Transformers' masking (masking_utils.find_packed_sequence_indices) then builds a
block-diagonal causal mask, so attention never crosses a row's boundary; flash-attention's varlen path reads the same
position_ids. The trap: transformers only looks at position_ids when `attention_mask` is None AND `past_key_values` is
None, and a causal LM's forward creates an empty cache itself unless `use_cache=False`: with the default cache the
rows silently attend to the rows before them (tests/unit/trainer/test_packed_forward.py shows it). Every packed
forward here passes use_cache=False and attention_mask=None.

Outputs come back in the padded layout ([B, L] or [B, L-1], zeros at padding), so the losses, per-sequence sums and
per-sample slices downstream are the padded path's. A model whose forward does not honour packed position_ids (found
by a probe on its first packed forward: a row packed after another must give the outputs it gives alone) runs
padded, said once in the log. Pure torch; no distributed state (the probe is one more forward, run by every rank in
the same order as the forward that triggers it).

Where packing pays (said once in the log): flash-attention's varlen kernels and flex attention's block mask cost
nothing for packing, so those always pack; sdpa packs through rlkit.models.packed_attention (no dense mask: the
attention of the padded batch, the linear layers of the real tokens only); any other attention (eager, sdpa with
sliding windows) would attend over one dense [N, N] mask, so each micro-batch packs only when the cost model
(`dense_packing_pays`) says it is cheaper. A micro-batch without padding runs as it is, except with flash-attention.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

_SETTING = "_rlkit_packing"  # on the model object: True/False as configured (absent: on)
_PROBED = "_rlkit_packing_works"  # the probe's verdict, once per model object
_PATH = "_rlkit_packing_path"  # how its packed forwards attend: one of the _PATHS keys
_SAID = "_rlkit_packing_said"  # the cost model's verdicts already said in the log
# The attention rlkit.models.ulysses registers (named here: that module imports this one)
SEQUENCE_PARALLEL_ATTENTION = "rlkit_ulysses"
_FREE_PACKING = ("flash_attention", "flex_attention")  # attention implementations whose packing needs no dense mask


@dataclass(frozen=True)
class PackedRows:
    """The real tokens of a right-padded batch as one row, and where each padded position lives in it."""

    input_ids: Tensor  # [1, N]
    position_ids: Tensor  # [1, N]: 0, 1, ... restarting at each row
    index: Tensor  # [B, L] long: the packed position of each padded position (0 at padding)
    valid: Tensor  # [B, L] bool: real tokens

    def unpack(self, packed: Tensor) -> Tensor:
        """[B, L, ...] from per-token outputs [1, N, ...] (zeros at padding); differentiable."""
        out = packed[0][self.index]
        return torch.where(self.valid.view(*self.valid.shape, *([1] * (out.dim() - 2))), out, 0.0)

    def unpack_next(self, packed: Tensor) -> Tensor:
        """[B, L-1] from next-token outputs [1, N-1] (position p predicts packed token p+1): padded position j of a
        row is its packed position; the prediction across a row's end (into the next row) is dropped."""
        index = self.index[:, :-1].clamp(max=packed.shape[1] - 1)  # a row's last token: dropped below
        return torch.where(self.valid[:, 1:], packed[0][index], 0.0)


def pack_rows(input_ids: Tensor, attention_mask: Tensor | None) -> PackedRows | None:
    """The packed form of a right-padded batch; None when the mask is not right padding (rows of ones then zeros,
    each row at least one token), which the padded path must then handle."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    batch, length = input_ids.shape
    lengths = attention_mask.long().sum(dim=1)
    positions = torch.arange(length, device=input_ids.device).expand(batch, length)
    valid = positions < lengths[:, None]
    if bool((lengths < 1).any()) or not torch.equal(valid, attention_mask.bool()):
        return None
    offsets = torch.cumsum(lengths, 0) - lengths
    index = torch.where(valid, offsets[:, None] + positions, 0)
    return PackedRows(input_ids[valid][None], positions[valid][None], index, valid)


def set_packing(model: nn.Module, enabled: bool) -> None:
    """Whether `model`'s forwards here pack their rows (the micro-batch spec's `packing`); default on."""
    setattr(model, _SETTING, bool(enabled))


def _probe(model: nn.Module) -> bool:
    """Does a row packed after another give the outputs it gives alone? (eval mode, no gradient.)"""
    device = next(model.parameters()).device
    first, second = [3, 5, 7, 9, 11], [13, 15, 17]
    packed_ids = torch.tensor([first + second], device=device)
    positions = torch.tensor([list(range(len(first))) + list(range(len(second)))], device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            packed = forward_packed(model, packed_ids, positions).logits[0, len(first):]
            alone = model(input_ids=packed_ids[:, len(first):], use_cache=False).logits[0]
    except TypeError:  # a forward that takes no position_ids
        return False
    finally:
        model.train(was_training)
    tolerance = 1e-4 if packed.dtype == torch.float32 else 2e-2
    error = float((packed.float() - alone.float()).abs().max() / alone.float().abs().max().clamp(min=1e-6))
    return error <= tolerance


def packs(model: nn.Module) -> bool:
    """Whether `model`'s forwards may pack: configured on and the model honours packed position_ids (probed on the
    first call; a model that does not is said once in the log and runs padded from then on). Which micro-batches do
    is `rows_for`'s call."""
    if not getattr(model, _SETTING, True):
        return False
    verdict = getattr(model, _PROBED, None)
    if verdict is None:
        path = _choose_path(model)
        verdict = _probe(model)
        setattr(model, _PROBED, verdict)
        if _is_rank0():
            name = type(model).__name__
            print(f"rlkit train: {name} packs micro-batches: {_PATHS[path]}" if verdict else
                  f"rlkit train: {name}'s attention does not keep packed sequences apart (position_ids); its "
                  "micro-batches run padded", flush=True)
    return bool(verdict)


_PATHS = {
    "free": "its attention takes packed rows without a mask (flash-attention varlen or flex attention)",
    "sdpa": "sdpa attends over the padded layout without a dense mask, the linear layers see only real tokens "
            "(rlkit.models.packed_attention)",
    "sp": "Ulysses attention splits each packed row over the sequence-parallel group (rlkit.models.ulysses)",
    "cost": "its attention would need one dense mask over each packed row, so a micro-batch packs only where that "
            "costs less than padding (the cost model in rlkit.models.packing)",
}


def _attention_name(model: nn.Module) -> str:
    return str(getattr(getattr(model, "config", None), "_attn_implementation", "") or "")


def _choose_path(model: nn.Module) -> str:
    """How `model` attends over packed rows (a _PATHS key), installing the packed sdpa attention where it fits."""
    from rlkit.models.packed_attention import install

    if any(kind in _attention_name(model) for kind in _FREE_PACKING):
        path = "free"
    elif _attention_name(model) == SEQUENCE_PARALLEL_ATTENTION:
        path = "sp"  # its packed rows are split by rlkit.trainer.head_logprobs, not judged by the cost model
    else:
        path = "sdpa" if install(model) else "cost"
    setattr(model, _PATH, path)
    return path


def dense_packing_pays(model: nn.Module, lengths: list[int]) -> bool:
    """Whether one packed row of sequences of `lengths`, attended over one dense mask, costs less than their padded
    rows. In multiply-adds: the linear layers and the head ~2 x parameters per token (N packed against B x Lmax
    padded); per layer and (query, key) pair, attention's two matmuls 4 x hidden plus ~256 per head for the
    materialised scores' mask, softmax and their backward (N^2 packed against B x Lmax^2). The 256 is this CPU's:
    eager attention over 16 sequences of 2.2k tokens in all, longest 429, on the tiny model ran 1.2x slower packed,
    where counting the matmuls alone called packing 1.6x cheaper."""
    config = getattr(model, "config", None)
    hidden, layers = getattr(config, "hidden_size", None), getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    if not (isinstance(hidden, int) and isinstance(layers, int) and isinstance(heads, int)):
        return False  # nothing to weigh: padded, today's path
    per_token = 2 * sum(p.numel() for p in model.parameters())
    per_pair = layers * (4 * hidden + 256 * heads)
    tokens, rows, longest = sum(lengths), len(lengths), max(lengths)
    packed = tokens * per_token + per_pair * tokens ** 2
    padded = rows * longest * per_token + per_pair * rows * longest ** 2
    return packed <= padded


def rows_for(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None) -> PackedRows | None:
    """The packed rows of a micro-batch when `model` packs it (see the module docstring), else None: padded."""
    rows = pack_rows(input_ids, attention_mask) if packs(model) else None
    if rows is not None and bool(rows.valid.all()) and getattr(model, _PATH, "free") != "free":
        return None  # no padding to save: today's padded path, without the re-layout
    if rows is None or getattr(model, _PATH, "free") != "cost":
        return rows
    lengths = rows.valid.sum(dim=1).tolist()
    pays = dense_packing_pays(model, lengths)
    said: set[bool] = getattr(model, _SAID, set())
    if pays not in said and _is_rank0():
        print(f"rlkit train: a micro-batch of {len(lengths)} sequences ({sum(lengths)} tokens, the longest "
              f"{max(lengths)}) runs {'packed' if pays else 'padded'}: the cost model finds it cheaper "
              f"({_attention_name(model)} attention; said once)", flush=True)
        setattr(model, _SAID, said | {pays})
    return rows if pays else None


def forward_packed(model: nn.Module, input_ids: Tensor, position_ids: Tensor, **kwargs: Any) -> Any:
    """model's forward over one packed row: no attention mask, no cache (the module docstring's trap), and the
    packed sdpa attention's bookkeeping where the model has it."""
    from rlkit.models.packed_attention import packed_call

    call = packed_call(position_ids) if getattr(model, _PATH, None) == "sdpa" else contextlib.nullcontext()
    with call:
        return model(input_ids=input_ids, position_ids=position_ids, attention_mask=None, use_cache=False, **kwargs)


def _is_rank0() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def packed_forward(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None,
                   read: Callable[[Any, PackedRows | None], Tensor]) -> Tensor:
    """read(model output, rows) of a forward over the batch: packed when `model` packs and the mask is right padding
    (rows given), padded otherwise (rows None). Never with a cache (see the module docstring)."""
    rows = rows_for(model, input_ids, attention_mask)
    if rows is None:
        return read(model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False), None)
    return read(forward_packed(model, rows.input_ids, rows.position_ids), rows)
