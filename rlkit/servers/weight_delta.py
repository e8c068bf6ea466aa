"""Delta weight pushes (`actor.weight_update_delta`): the wire format the trainer (rlkit.weights.delta) and the
servers' receive paths share, and the copy of the weights a receiver keeps to apply a delta to.

Why: at RL learning rates most bfloat16 elements do not change from one step to the next (2.2% at lr 1e-6,
measured by bench/bench_delta.py, docs/development/benchmarks.md), so a push can carry only the changed elements,
15x fewer bytes on the disk or the wire.
Applying them needs the previous version in the checkpoint's layout (Hugging Face names, whole tensors), which
an engine does not hold (vLLM keeps its weights fused and sharded), so each receiving worker keeps a host-memory copy
of the last version it loaded (`DeltaBase`; one model's bytes in the wire dtype), filled by every push of a run that
uses deltas, full or not. The engine then loads whole tensors as in a full push: a delta saves bytes, not loading.

Wire: each tensor of a push travels whole under its own name, or as two tensors, `<name>@delta.index` (the flat
indices of the elements that changed, int32 or int64, ascending) and `<name>@delta.values` (their new values, in the
tensor's dtype), in either order (a safetensors file keeps its own). Every push has a `DeltaHeader`: its own id
and, for a delta, the id of the push it applies to. A receiver whose copy is not of that base refuses it, naming
both (the trainer sends a full push to any server it does not know to hold its last push: restarted, added,
failed). Elements are compared bit for bit.

Torch is imported inside the functions: the servers' HTTP side imports `DeltaHeader` without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

INDEX = "@delta.index"
VALUES = "@delta.values"
DELTA_FILE = "rlkit-delta.safetensors"  # a delta push by disk: this one file in the version's directory


@dataclass(frozen=True)
class DeltaHeader:
    """What a push says of itself in a run with deltas: its id and, for a delta, the id of the push it applies to."""

    id: str
    base: str | None = None  # None: a full push (the receiver keeps a copy of it)

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "base": self.base}

    @classmethod
    def from_json(cls, value: object) -> DeltaHeader:
        if not isinstance(value, Mapping) or not isinstance(value.get("id"), str) or not value["id"]:
            raise ValueError(f"a delta header must be {{'id': str, 'base': str | None}}, not {value!r}")
        base = value.get("base")
        if base is not None and not isinstance(base, str):
            raise ValueError(f"a delta header's base must be a string or null, not {base!r}")
        return cls(id=value["id"], base=base)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as integers of the same width (bit-for-bit comparison: -0.0 != 0.0, NaN == NaN)."""
    import torch

    widths = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return tensor.reshape(-1).view(widths[tensor.element_size()])


def encode(name: str, new: torch.Tensor, old: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """`new` as it travels against `old` (the receiver's copy): whole when there is no `old` of its shape and dtype or
    when the changed elements with their indices would not be smaller; else its index and values tensors. At least
    one element travels (an unchanged tensor sends its first), so no tensor on the wire is empty."""
    import torch

    if old is None or old.shape != new.shape or old.dtype != new.dtype or new.numel() == 0:
        return {name: new}
    index_dtype = torch.int32 if new.numel() < 2**31 else torch.int64
    changed = torch.nonzero(_bits(new) != _bits(old)).reshape(-1)
    if changed.numel() * (index_dtype.itemsize + new.element_size()) >= new.numel() * new.element_size():
        return {name: new}
    if changed.numel() == 0:
        changed = torch.zeros(1, dtype=torch.int64)
    return {name + INDEX: changed.to(index_dtype), name + VALUES: new.reshape(-1)[changed]}


def read_push(directory: Path, header: DeltaHeader) -> list[tuple[str, torch.Tensor]]:
    """The tensors of a push by disk in `directory`: the delta file of a delta push (its metadata must name the
    header's push), every safetensors file of the checkpoint of a full one."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    if header.base is None:
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{directory} holds no safetensors file: not a checkpoint")
        return [pair for path in files for pair in load_file(path).items()]
    path = directory / DELTA_FILE
    with safe_open(str(path), "pt") as opened:  # one open: its header, then its tensors
        written = (opened.metadata() or {}).get("id")
        if written != header.id:
            raise ValueError(f"{path} is push {written!r}, not the announced {header.id}")
        return [(name, opened.get_tensor(name)) for name in opened.keys()]  # noqa: SIM118 - safe_open: no __iter__


class DeltaBase:
    """A receiving worker's copy of the last push it loaded (name -> whole tensor on the CPU), and its id.

    Per push: `begin(header)` (refuses a delta whose base is not the copy's) -> `take(...)` for what arrives ->
    `commit()` once the push is loaded whole. Between begin and commit the copy is of no push (id None): a push that
    fails midway leaves a copy no delta can be applied to, so the next push must be full.
    """

    def __init__(self) -> None:
        self.id: str | None = None
        self.tensors: dict[str, torch.Tensor] = {}
        self._pending: str | None = None
        self._parts: dict[str, dict[str, torch.Tensor]] = {}  # half of a delta (index or values), by tensor name

    def begin(self, header: DeltaHeader) -> None:
        if header.base is not None and header.base != self.id:
            raise ValueError(f"a delta push ({header.id}) applies to push {header.base}, but this server holds "
                             f"{self.id or 'no complete push'}; the trainer must send it a full push")
        self.id, self._pending, self._parts = None, header.id, {}

    def take(self, received: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """Apply what arrived (whole tensors are kept, deltas written into the copy); the whole tensors it makes
        complete, by name, to load. Applying the same tensors again (a bucket sent again) changes nothing."""
        if self._pending is None:
            raise RuntimeError("delta weights arrived outside a push (DeltaBase.begin first)")
        complete: list[tuple[str, torch.Tensor]] = []
        for name, tensor in received:
            part = INDEX if name.endswith(INDEX) else VALUES if name.endswith(VALUES) else None
            if part is None:
                self.tensors[name] = tensor.cpu().contiguous()  # no copy for a CPU tensor that is contiguous
                complete.append((name, self.tensors[name]))
                continue
            base = name.removesuffix(part)
            parts = self._parts.setdefault(base, {})
            parts[part] = tensor
            if len(parts) == 2:
                del self._parts[base]
                complete.append((base, self._apply(base, parts[INDEX], parts[VALUES])))
        return complete

    def _apply(self, name: str, index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        held = self.tensors.get(name)
        if held is None or held.dtype != values.dtype or index.shape != values.shape or (
                index.numel() and not 0 <= int(index.min()) <= int(index.max()) < held.numel()):
            copy = "none" if held is None else f"{held.dtype}, {held.numel()} elements"
            raise ValueError(f"a delta for {name} does not fit the copy held ({copy}; delta: {values.dtype}, "
                             f"{values.numel()} values)")
        held.reshape(-1)[index.long()] = values.to(held.device)
        return held

    def commit(self) -> None:
        """The push is loaded whole: the copy is of it (unless part of a delta never came: then of no push)."""
        self.id = None if self._parts else self._pending
        self._pending, self._parts = None, {}
