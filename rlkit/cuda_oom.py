"""The figures of torch's CUDA out-of-memory message, read from its text (torch-free: the serve step reads an
engine's output, the trainer its own error), and the one rule both use: whether other processes held the memory.

torch's allocator writes "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is
free. ... this process has 78.10 GiB memory in use. Of the allocated memory ... and 120.00 MiB is reserved by PyTorch
but unallocated." (sizes under 1 KiB as "0 bytes"). A figure it did not print is None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OTHERS_SHARE = 0.05  # memory of other processes above this share of the GPU: the out-of-memory was not all this one's
_SIZE = r"(\d{1,12}(?:\.\d{1,8})?) ?(bytes|[KMGTP]?i?B)"  # "1.96 GiB", "20.00 MiB", "0 bytes" (bounded numbers)
_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}
_TRIED = re.compile(rf"Tried to allocate {_SIZE}")
_TOTAL = re.compile(rf"GPU (\d{{1,15}}) has a total capacity of {_SIZE} of which {_SIZE} is free")
_OWN = re.compile(rf"this process has {_SIZE} memory in use")
_RESERVED = re.compile(rf"{_SIZE} is reserved by PyTorch but unallocated")


@dataclass(frozen=True)
class Size:
    """A size as torch printed it (`said`, e.g. "79.19 GiB") and in bytes."""

    said: str
    bytes: float


@dataclass(frozen=True)
class OomFigures:
    gpu: str | None
    total: Size | None
    free: Size | None
    own: Size | None  # this process's use, non-PyTorch memory included
    tried: Size | None
    reserved: Size | None  # reserved by PyTorch but unallocated

    def others(self) -> float | None:
        """Bytes other processes held (total - free - this process's), None without those figures."""
        if self.total is None or self.free is None or self.own is None:
            return None
        return self.total.bytes - self.free.bytes - self.own.bytes

    def others_held_memory(self) -> bool:
        """Whether other processes held more than OTHERS_SHARE of the GPU (a restart may find it free)."""
        others = self.others()
        return others is not None and self.total is not None and others > OTHERS_SHARE * self.total.bytes


def _size(match: re.Match[str] | None, at: int = 1) -> Size | None:
    if match is None:
        return None
    number, unit = match.group(at), match.group(at + 1)
    return Size(f"{number} {unit}", float(number) * _UNITS.get(unit, 1))


def oom_figures(text: str) -> OomFigures:
    """The figures torch's out-of-memory message in `text` holds."""
    total = _TOTAL.search(text)
    return OomFigures(total.group(1) if total else None, _size(total, 2), _size(total, 4),
                      _size(_OWN.search(text)), _size(_TRIED.search(text)), _size(_RESERVED.search(text)))
