"""Recover checkpoints as one file per trainer rank: the rank's local shards of its model and optimizer states.

Why not torch.distributed.checkpoint: it plans, writes and loads item by item (~400 items for a 110 M model), which
made a load 5x the time of reading its bytes. A rank file is written front to back in one pass, its checksum computed
on the way (on another thread: xxhash releases the GIL); when the world and the sharding are those it was written
with, the rank reads it back in one pass straight into its own tensors, in 2 MiB blocks on every core it has, each
block hashed as it lands (rlkit.trainer.block_read), so the checksum costs no second read. A load with another world
(or sharding along dim 0 that differs) takes the rows it needs from every file, after checking those files whole
(rlkit.trainer.rank_gather).

Format: safetensors (8-byte little-endian header length, JSON header, the tensors' bytes in order), so that
safetensors.safe_open reads it; the header's `__metadata__["rlkit"]` (JSON) holds the rank, the world, each tensor's
global shape and offset, tensors that share storage (a tied head), and what is not a tensor (optimizer param groups).
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from io import FileIO
from pathlib import Path
from queue import SimpleQueue
from typing import Any, BinaryIO

import torch
import xxhash
from torch import Tensor

from rlkit import untrusted_json
from rlkit.errors import StepError
from rlkit.trainer import block_read
from rlkit.trials import recover_layout
from rlkit.trials.recover_layout import BLOCK_CHECKSUM, RANK_FILE, FileDigest, combine_blocks, file_checksum

FORMAT = 1
CHUNK = 2 << 20  # bytes per write: the hashing thread finds them still in the CPU's cache
_MAX_HEADER = 64 << 20
DTYPE_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
                torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                torch.bool: "BOOL"}


class DamagedCheckpoint(StepError):
    """A rank file that does not match its manifest; found while loading it, so some tensors hold its bytes."""


class LayoutChanged(Exception):
    """This rank's file was written for other shards (another world size): the rows are gathered instead."""


def rank_file_name(rank: int, world: int) -> str:
    return f"rank-{rank:05d}-of-{world:05d}.safetensors"


def rank_files(directory: Path) -> list[Path]:
    """The rank files of one engine's shard directory (empty for a torch.distributed.checkpoint of older rlkit)."""
    return sorted(p for p in directory.iterdir() if RANK_FILE.match(p.name)) if directory.is_dir() else []


@dataclass
class Piece:
    """One tensor as this rank holds it: its local part, the whole tensor's shape and how it is split (`layout`,
    empty for a plain tensor: the same layout on the same rank is the same piece)."""

    name: str
    local: Tensor
    global_shape: list[int]
    layout: str
    whole: Tensor  # the DTensor (or the plain tensor): where the piece's offset comes from

    def global_offset(self) -> list[int]:
        """Where the local part starts in the whole tensor, along each dimension."""
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        if not isinstance(self.whole, DTensor):
            return [0] * self.whole.dim()
        whole = self.whole
        return list(compute_local_shape_and_global_offset(whole.shape, whole.device_mesh, whole.placements)[1])


def flatten(model_sd: Mapping[str, Any], optim_sd: Mapping[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """get_state_dict's model and optimizer state as tensors by flat name, and the optimizer's other values (its
    param groups, non-tensor state) as JSON."""
    tensors = {f"model/{k}": v for k, v in model_sd.items() if isinstance(v, Tensor)}
    values: dict[str, Any] = {}
    for fqn, entry in optim_sd["state"].items():
        for key, value in entry.items():
            if isinstance(value, Tensor):
                tensors[f"optim/{fqn}/{key}"] = value
            else:
                values[f"{fqn}/{key}"] = value
    return tensors, {"param_groups": optim_sd["param_groups"], "optim_values": values}


def pieces_of(tensors: Mapping[str, Tensor]) -> list[Piece]:
    """This rank's part of every tensor (a DTensor's local shard, a plain tensor whole), sharing their storage."""
    from torch.distributed.tensor import DTensor

    pieces = []
    for name, value in tensors.items():
        if isinstance(value, DTensor):
            layout = f"{value.placements}@{tuple(value.device_mesh.shape)}"
            pieces.append(Piece(name, value.to_local().detach(), list(value.shape), layout, value))
        else:
            pieces.append(Piece(name, value.detach(), list(value.shape), "", value))
    return pieces


class _Hasher:
    """BLOCK_CHECKSUM of a stream of buffers, hashed in order on a thread of its own (xxhash releases the GIL), so
    that writing the next chunk overlaps hashing the last one. A buffer must not change until `wait` on the ticket
    `feed` gave for it returns."""

    def __init__(self) -> None:
        self._block = xxhash.xxh3_128()
        self._in_block = 0
        self._blocks: list[bytes] = []
        self._queue: SimpleQueue[memoryview | None] = SimpleQueue()
        self._fed = 0
        self._hashed = 0
        self._failed: BaseException | None = None  # the hashing thread's error: a waiter raises it, never waits on
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="rlkit-xxh3", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while (data := self._queue.get()) is not None:
                while data:
                    take = min(len(data), recover_layout.CHECKSUM_BLOCK - self._in_block)
                    self._block.update(data[:take])
                    self._in_block += take
                    data = data[take:]
                    if self._in_block == recover_layout.CHECKSUM_BLOCK:
                        self._end_block()
                with self._progress:
                    self._hashed += 1
                    self._progress.notify_all()
        except BaseException as exc:  # a waiter would wait forever for a count that no longer grows
            with self._progress:
                self._failed = exc
                self._progress.notify_all()

    def _end_block(self) -> None:
        self._blocks.append(self._block.digest())
        self._block.reset()
        self._in_block = 0

    def feed(self, data: memoryview) -> int:
        self._queue.put(data)
        self._fed += 1
        return self._fed

    def wait(self, ticket: int) -> None:
        with self._progress:
            self._progress.wait_for(lambda: self._hashed >= ticket or self._failed is not None)
            if self._hashed < ticket:
                raise RuntimeError(f"checksumming the rank file failed: {type(self._failed).__name__}: "
                                   f"{self._failed}") from self._failed

    def hexdigest(self) -> str:
        """The digest of everything fed (call once, at the end)."""
        self.wait(self._fed)
        if self._in_block:
            self._end_block()
        return combine_blocks(self._blocks)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


def bytes_of(tensor: Tensor) -> memoryview:
    """A CPU, contiguous tensor's bytes, shared (writing into the view writes the tensor)."""
    return tensor.reshape(-1).view(torch.uint8).numpy().data


def _write_all(f: BinaryIO, data: memoryview) -> None:
    while data:
        data = data[f.write(data):]


def write_rank_file(path: Path, pieces: list[Piece], values: Mapping[str, Any], *, rank: int, world: int
                    ) -> FileDigest:
    """Write this rank's pieces to `path` front to back and fsync; returns its size and checksum (BLOCK_CHECKSUM). A
    piece sharing another's storage (a tied head) is written once and recorded as an alias."""
    header: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    first_of: dict[tuple[int, torch.dtype, tuple[int, ...]], str] = {}
    written: list[Piece] = []
    size = 0
    for piece in pieces:
        key = (piece.local.data_ptr(), piece.local.dtype, tuple(piece.local.shape))
        if piece.local.numel() and key in first_of:
            aliases[piece.name] = first_of[key]
            continue
        first_of.setdefault(key, piece.name)
        nbytes = piece.local.numel() * piece.local.element_size()
        header[piece.name] = {"dtype": DTYPE_NAMES[piece.local.dtype], "shape": list(piece.local.shape),
                              "data_offsets": [size, size + nbytes]}
        size += nbytes
        written.append(piece)
    meta = {"format": FORMAT, "rank": rank, "world": world, "aliases": aliases, **values,
            "pieces": {p.name: [p.global_shape, p.layout, p.global_offset()] for p in pieces}}
    header["__metadata__"] = {"rlkit": json.dumps(meta)}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    hasher = _Hasher()
    try:
        with open(path, "wb", buffering=0) as f:
            for part in (struct.pack("<Q", len(raw)), raw):
                _write_all(f, memoryview(part))
                hasher.feed(memoryview(part))
            for piece in written:
                host = piece.local.cpu().contiguous()  # the same tensor when it already is (no copy)
                data = bytes_of(host)
                for start in range(0, len(data), CHUNK):
                    _write_all(f, data[start:start + CHUNK])
                    hasher.feed(data[start:start + CHUNK])
            os.fsync(f.fileno())
        return FileDigest(8 + len(raw) + size, BLOCK_CHECKSUM, hasher.hexdigest())
    finally:
        hasher.close()


def read_header(path: Path) -> tuple[int, dict[str, Any], dict[str, Any], int]:
    """A rank file's header: where its data starts, its tensor entries, its rlkit metadata and the file's size.
    DamagedCheckpoint when there is no such header."""
    with open(path, "rb") as f:
        try:
            raw, header, meta = _parse_header(f)
        except (ValueError, KeyError, TypeError) as exc:
            raise DamagedCheckpoint(f"{path.name} has no readable header ({exc})") from None
        return len(raw), header, meta, os.fstat(f.fileno()).st_size


def _parse_header(f: BinaryIO) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
    prefix = f.read(8)
    length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
    if not 0 < length <= _MAX_HEADER:
        raise ValueError(f"no safetensors header (length {length})")
    raw = f.read(length)
    header = untrusted_json.loads(raw)  # a damaged header may nest deeper than json.loads follows
    if not isinstance(header, dict) or not all(isinstance(entry, dict) for entry in header.values()):
        raise ValueError("the header is not a table of tensors")
    meta = untrusted_json.loads(header.pop("__metadata__")["rlkit"])
    if not (isinstance(meta, dict) and isinstance(meta.get("aliases"), dict) and isinstance(meta.get("pieces"), dict)):
        raise ValueError("its rlkit metadata has no aliases and pieces")
    if meta.get("format") != FORMAT:
        raise ValueError(f"rank file format {meta.get('format')!r}, this rlkit reads {FORMAT}")
    return prefix + raw, header, meta


def recorded(expected: Mapping[str, FileDigest], path: Path) -> FileDigest:
    """The manifest's size and checksum of `path`; DamagedCheckpoint for a rank file the manifest does not list."""
    if (digest := expected.get(str(path))) is None:
        raise DamagedCheckpoint(f"{path.name} is not in the checkpoint's manifest")
    return digest


def read_exact(f: FileIO, into: memoryview) -> None:
    got = 0
    while got < len(into):
        n = f.readinto(into[got:])
        if not n:
            raise EOFError("the file ends early")
        got += n


def _check_layout(header: Mapping[str, Any], meta: Mapping[str, Any], targets: Mapping[str, Piece]) -> None:
    """LayoutChanged unless every target is in the file (this rank's, of the same world) with its local shape, dtype,
    whole shape and layout: then its place in the whole tensor is the same too."""
    for name, piece in targets.items():
        source = name if name in header else meta["aliases"].get(name)
        entry = header.get(source) if source is not None else None
        if entry is None:
            raise LayoutChanged(f"{name} is not in the file")
        if (entry["dtype"] != DTYPE_NAMES[piece.local.dtype] or entry["shape"] != list(piece.local.shape)
                or meta["pieces"].get(name, [])[:2] != [piece.global_shape, piece.layout]):
            raise LayoutChanged(f"{name} is sharded otherwise")


def read_rank_file(path: Path, targets: Mapping[str, Piece], expected: FileDigest | None) -> dict[str, Any]:
    """Read this rank's own file straight into `targets` in one pass, checking it against `expected` on the way (a
    whole-file checksum of older rlkit versions: before); returns its metadata. LayoutChanged (before any target is
    written) when the file holds other shards; DamagedCheckpoint when its bytes do not match (the targets then hold
    some of them)."""
    data_start, header, meta, size = read_header(path)
    try:
        _check_layout(header, meta, targets)
    except (KeyError, TypeError, AttributeError) as exc:
        raise DamagedCheckpoint(f"{path.name} has a malformed header ({type(exc).__name__}: {exc})") from None
    spans, temporaries = _spans(path, header, data_start, size, targets)
    if expected is not None and expected.size != size:
        raise DamagedCheckpoint(f"{path.name} has {size} bytes, its manifest says {expected.size}")
    if expected is not None and expected.algorithm != BLOCK_CHECKSUM and (
            file_checksum(path, expected.algorithm) != expected.digest):
        raise DamagedCheckpoint(f"{path.name} does not match its {expected.algorithm} checksum")
    try:
        blocks = block_read.read_blocks(path, spans, recover_layout.CHECKSUM_BLOCK)
    except EOFError:
        raise DamagedCheckpoint(f"{path.name} ends early") from None
    if expected is not None and expected.algorithm == BLOCK_CHECKSUM and combine_blocks(blocks) != expected.digest:
        raise DamagedCheckpoint(f"{path.name} does not match its {BLOCK_CHECKSUM} checksum")
    for piece, whole in temporaries:
        piece.local.copy_(whole)
    fill_aliases(targets, meta)
    return meta


def _spans(path: Path, header: Mapping[str, Any], data_start: int, size: int, targets: Mapping[str, Piece]
           ) -> tuple[list[block_read.Span], list[tuple[Piece, Tensor]]]:
    """Where every byte of the file goes, in file order, and the (piece, contiguous temporary) pairs to copy after
    the read for targets that are not contiguous. DamagedCheckpoint unless the tensors follow each other from the
    header to the end of the file, each of its target's size."""
    spans = [block_read.Span(0, data_start)]
    temporaries: list[tuple[Piece, Tensor]] = []
    at = data_start
    entries = []
    for name, entry in header.items():
        offsets = entry.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise DamagedCheckpoint(f"{path.name}: {name} has no data offsets")
        entries.append((offsets[0], offsets[1], name))
    for first, last, name in sorted(entries):
        start, end = data_start + first, data_start + last
        piece = targets.get(name)
        nbytes = None if piece is None else piece.local.numel() * piece.local.element_size()
        if start != at or end < start or (nbytes is not None and end - start != nbytes):
            raise DamagedCheckpoint(f"{path.name}: {name} is not where its header says")
        at = end
        if piece is None:
            spans.append(block_read.Span(start, end))
            continue
        local = piece.local
        if not local.is_contiguous():
            local = torch.empty_like(piece.local, memory_format=torch.contiguous_format)
            temporaries.append((piece, local))
        flat = local.reshape(-1).view(torch.uint8)
        if local.device.type == "cpu":
            spans.append(block_read.Span(start, end, host=flat.numpy().data))
        else:
            spans.append(block_read.Span(start, end, device=flat))
    if at != size:
        raise DamagedCheckpoint(f"{path.name} has {size - at} bytes after its last tensor" if size > at
                                else f"{path.name} ends early")
    return spans, temporaries


def fill_aliases(targets: Mapping[str, Piece], meta: Mapping[str, Any]) -> None:
    """A target saved as an alias of another: one storage here too (nothing to do), else a copy of it."""
    for name, original in meta["aliases"].items():
        piece, source = targets.get(name), targets.get(original)
        if piece is not None and source is not None and piece.local.data_ptr() != source.local.data_ptr():
            piece.local.copy_(source.local)
