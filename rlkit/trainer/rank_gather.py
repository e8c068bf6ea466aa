"""A recover checkpoint loaded by another world than the one that wrote it: each rank takes the rows it needs from
whichever rank files hold them (FSDP2 splits along dim 0 only), after checking those files whole. Its own module
because the one-read path of an unchanged world (rlkit.trainer.rank_files.read_rank_file) is the common one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rlkit.errors import StepError
from rlkit.trainer.rank_files import (
    DTYPE_NAMES,
    DamagedCheckpoint,
    Piece,
    bytes_of,
    fill_aliases,
    rank_files,
    read_exact,
    read_header,
    recorded,
)
from rlkit.trials.recover_layout import FileDigest, file_checksum

_Source = tuple[Path, int, dict[str, Any], dict[str, Any]]  # file, where its data starts, header, rlkit metadata


def gather_rows(directory: Path, targets: Mapping[str, Piece], expected: Mapping[str, FileDigest] | None
                ) -> dict[str, Any]:
    """Fill `targets` from the rank files of `directory` whatever world wrote them: each tensor is whole in a file
    (replicated) or split along dim 0 only (FSDP2's sharding). Every file read from is checked whole against
    `expected` first (DamagedCheckpoint); a tensor that cannot be put together is a StepError, unless a damaged file
    explains it (DamagedCheckpoint). Returns the metadata (the same param groups in every file)."""
    files = rank_files(directory)
    if not files:
        raise StepError(f"{directory} holds no rank file")
    try:
        sources = [_source(path) for path in files]
        plan = [step for name, piece in targets.items() if piece.local.numel() for step in _rows(name, piece, sources)]
    except DamagedCheckpoint:
        raise
    except (StepError, KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        _check_whole(files, expected)  # a header damaged where its checksum would show comes first
        if isinstance(exc, StepError):
            raise
        raise DamagedCheckpoint(f"the rank files of {directory} have a malformed header ({exc!r})") from None
    used = sorted({step[1] for step in plan})
    _check_whole(used, expected)
    with contextlib.ExitStack() as stack:  # each file opened once, not once per tensor it holds rows of
        opened = {path: stack.enter_context(open(path, "rb", buffering=0)) for path in used}
        for piece, path, position, at, count in plan:
            f = opened[path]
            f.seek(position)
            if piece.local.device.type == "cpu" and piece.local.is_contiguous():
                read_exact(f, bytes_of(piece.local)[at:at + count])
                continue
            buffer = torch.empty(count, dtype=torch.uint8)
            read_exact(f, bytes_of(buffer))
            whole = piece.local.contiguous()
            whole.reshape(-1).view(torch.uint8)[at:at + count].copy_(buffer)
            if whole.data_ptr() != piece.local.data_ptr():
                piece.local.copy_(whole)
    meta = sources[0][3]
    fill_aliases(targets, meta)
    return dict(meta)


def _source(path: Path) -> _Source:
    data_start, header, meta, _size = read_header(path)
    return path, data_start, header, meta


def _check_whole(paths: list[Path], expected: Mapping[str, FileDigest] | None) -> None:
    """DamagedCheckpoint unless every file matches its size and checksum in `expected` (None: checked already)."""
    if expected is None:
        return
    for path in paths:
        digest = recorded(expected, path)
        if (path.stat().st_size, file_checksum(path, digest.algorithm)) != (digest.size, digest.digest):
            raise DamagedCheckpoint(f"{path.name} does not match its {digest.algorithm} checksum")


def _rows(name: str, piece: Piece, sources: list[_Source]) -> list[tuple[Piece, Path, int, int, int]]:
    """Where this rank's rows of one tensor are: (piece, file, file position, byte in the piece, bytes)."""
    shape, local, offset = piece.global_shape, list(piece.local.shape), piece.global_offset()
    if local[1:] != shape[1:] or any(offset[1:]):
        raise StepError(f"cannot reshard {name}: it is not split along its first dimension only")
    row = piece.local.element_size() * int(torch.Size(shape[1:]).numel())
    begin = offset[0] if shape else 0
    end = begin + (local[0] if shape else 1)
    spans = []
    for path, data_start, header, meta in sources:
        source = name if name in header else meta["aliases"].get(name)
        if source not in header:
            continue
        global_shape, _layout, saved_offset = meta["pieces"][name]
        entry = header[source]
        if global_shape != shape or entry["dtype"] != DTYPE_NAMES[piece.local.dtype]:
            raise StepError(f"{name} is {entry['dtype']} {global_shape} in {path.name}, "
                            f"{DTYPE_NAMES[piece.local.dtype]} {shape} here")
        first = saved_offset[0] if shape else 0
        spans.append((first, first + (entry["shape"][0] if shape else 1), path, data_start + entry["data_offsets"][0]))
    plan, cursor = [], begin
    for first, last, path, position in sorted(spans, key=lambda span: span[0]):
        if first <= cursor < last:
            stop = min(end, last)
            plan.append((piece, path, position + (cursor - first) * row, (cursor - begin) * row, (stop - cursor) * row))
            cursor = stop
        if cursor == end:
            return plan
    raise StepError(f"the rank files hold rows {begin}..{end} of {name} only up to {cursor}")
