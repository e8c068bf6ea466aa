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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

_SETTING = "_rlkit_packing"  # on the model object: True/False as configured (absent: on)
_PROBED = "_rlkit_packing_works"  # the probe's verdict, once per model object


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
            packed = model(input_ids=packed_ids, position_ids=positions, use_cache=False).logits[0, len(first):]
            alone = model(input_ids=packed_ids[:, len(first):], use_cache=False).logits[0]
    except TypeError:  # a forward that takes no position_ids
        return False
    finally:
        model.train(was_training)
    tolerance = 1e-4 if packed.dtype == torch.float32 else 2e-2
    error = float((packed.float() - alone.float()).abs().max() / alone.float().abs().max().clamp(min=1e-6))
    return error <= tolerance


def packs(model: nn.Module) -> bool:
    """Whether `model`'s next forward packs: configured on and the model honours packed position_ids (probed on the
    first call; a model that does not is said once in the log and runs padded from then on)."""
    if not getattr(model, _SETTING, True):
        return False
    verdict = getattr(model, _PROBED, None)
    if verdict is None:
        verdict = _probe(model)
        setattr(model, _PROBED, verdict)
        if not verdict and _is_rank0():
            print(f"rlkit train: {type(model).__name__}'s attention does not keep packed sequences apart "
                  "(position_ids); its micro-batches run padded", flush=True)
    return bool(verdict)


def _is_rank0() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def packed_forward(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None,
                   read: Callable[[Any, PackedRows | None], Tensor]) -> Tensor:
    """read(model output, rows) of a forward over the batch: packed when `model` packs and the mask is right padding
    (rows given), padded otherwise (rows None). Never with a cache (see the module docstring)."""
    rows = pack_rows(input_ids, attention_mask) if packs(model) else None
    if rows is None:
        return read(model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False), None)
    out = model(input_ids=rows.input_ids, position_ids=rows.position_ids, attention_mask=None, use_cache=False)
    return read(out, rows)
