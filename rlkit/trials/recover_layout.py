"""The on-disk layout of recover checkpoints, and how to tell a complete one (torch-free, no rlkit.trainer import).

The login node reads it (`recover.mode=resume` needs a checkpoint, checked at submit) and so does the trainer
(rlkit.trainer.recover writes, seals and prunes checkpoints in this layout): see rlkit.trainer.recover for the layout.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from rlkit import untrusted_json

logger = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
STATE = "trainer_state.json"
SHARDS = "model_optim"
_DIR = re.compile(r"^step-(\d{8})$")
_ASIDE = re.compile(r"^\.step-(\d{8})\.old$")  # rlkit.fsutil.replace_dir's name for the replaced one
_TMP = re.compile(r"^\.step-(\d{8})\.tmp$")
CHECKSUM = "xxh3_128"  # of the whole file: the small files, and rank files of older rlkit versions
# a rank file's: xxh3-128 over the 16-byte xxh3-128 digests of its consecutive 2 MiB blocks (the last one shorter), so
# that its loader reads and hashes blocks on as many threads as it has cores and still checks one digest
BLOCK_CHECKSUM = "xxh3_128_of_2mib_blocks"
CHECKSUM_BLOCK = 2 << 20
_LEGACY_CHECKSUM = "sha256"
_ALGORITHMS = (BLOCK_CHECKSUM, CHECKSUM, _LEGACY_CHECKSUM)
# a trainer rank's own file of its shards (rlkit.trainer.rank_files): its loader checks its checksum while reading it
RANK_FILE = re.compile(r"^rank-(\d{5})-of-(\d{5})\.safetensors$")


def recover_root(trial_dir: Path) -> Path:
    return Path(trial_dir) / "recover"


def checkpoint_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


class FileDigest(NamedTuple):
    """A file's size and checksum as a manifest records them."""

    size: int
    algorithm: str
    digest: str


def combine_blocks(block_digests: Iterable[bytes]) -> str:
    """BLOCK_CHECKSUM's hex digest from the xxh3-128 digests of a file's blocks, in file order."""
    import xxhash  # trainer extra; the login node never hashes

    return str(xxhash.xxh3_128_hexdigest(b"".join(block_digests)))


def file_checksum(path: Path, algorithm: str = CHECKSUM) -> str:
    """The hex digest of a file by one of the manifest's algorithms (sha256: manifests of older rlkit versions)."""
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"unknown checksum {algorithm!r}")
    with open(path, "rb") as f:
        if not os.fstat(f.fileno()).st_size:
            return _digest(algorithm, memoryview(b""))
        # mapped, not copied: the check costs about half a plain read
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as data:
            return _digest(algorithm, data)


def _digest(algorithm: str, data: memoryview) -> str:
    if algorithm == _LEGACY_CHECKSUM:
        return hashlib.sha256(data).hexdigest()
    import xxhash

    if algorithm == CHECKSUM:
        return str(xxhash.xxh3_128_hexdigest(data))
    return combine_blocks(xxhash.xxh3_128_digest(data[at:at + CHECKSUM_BLOCK])
                          for at in range(0, len(data), CHECKSUM_BLOCK))


def entry_digest(entry: dict[str, Any]) -> FileDigest:
    """A (well-formed) manifest entry's size and checksum, by the first algorithm it has."""
    algorithm = next(a for a in _ALGORITHMS if isinstance(entry.get(a), str))
    return FileDigest(entry["size"], algorithm, entry[algorithm])


def _manifest_entries(directory: Path) -> list[dict[str, Any]] | str:
    """The manifest's file entries, or what is wrong with the manifest (it is read as untrusted input)."""
    try:
        entries = untrusted_json.loads((directory / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"no readable {MANIFEST} ({type(exc).__name__})"
    if not isinstance(entries, list):
        return f"{MANIFEST} has no list of files"
    for entry in entries:
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str) and isinstance(entry.get("size"), int)
                and any(isinstance(entry.get(a), str) for a in _ALGORITHMS)):
            return f"{MANIFEST} has a malformed entry: {str(entry)[:120]}"
        if ".." in Path(entry["path"]).parts or Path(entry["path"]).is_absolute():
            return f"{MANIFEST} names a file outside the checkpoint: {entry['path']}"
    return entries


def checked_while_loaded(entry: dict[str, Any]) -> bool:
    """Whether a manifest entry is a rank file with an xxh3 checksum, which its loader verifies (rlkit.trainer.
    rank_files: the block checksum in the same pass that reads it; the whole-file one of older versions first)."""
    return bool(RANK_FILE.match(Path(entry["path"]).name)) and entry_digest(entry).algorithm != _LEGACY_CHECKSUM


def verify(directory: Path, *, checksums: bool = True, defer_rank_files: bool = False) -> str | None:
    """None when `directory` is a complete checkpoint; else what is wrong with it. Without `checksums` only the
    manifest, the files and their sizes are checked (cheap: the login node, pruning); with them every byte is read
    (the compute node, once before loading). `defer_rank_files` leaves the rank files' checksums to their loader,
    which must then be given `manifest_digests` (the trainer's resume)."""
    entries = _manifest_entries(directory)
    if isinstance(entries, str):
        return entries
    for entry in entries:
        path = directory / entry["path"]
        if not path.is_file():
            return f"{entry['path']} is missing"
        if path.stat().st_size != entry["size"]:
            return f"{entry['path']} has {path.stat().st_size} bytes, the manifest says {entry['size']}"
    if not (directory / STATE).is_file():
        return f"{STATE} is missing"
    for entry in entries if checksums else []:
        if defer_rank_files and checked_while_loaded(entry):
            continue
        _size, algorithm, digest = entry_digest(entry)
        if file_checksum(directory / entry["path"], algorithm) != digest:
            return f"{entry['path']} does not match its {algorithm} checksum"
    return None


def manifest_digests(directory: Path) -> dict[str, FileDigest]:
    """Size and checksum by path (as `directory / entry`, the form save_sharded returns) of every file of a
    checkpoint whose manifest has an xxh3 checksum for it; empty for a manifest that cannot be read (verify says
    why)."""
    entries = _manifest_entries(directory)
    if isinstance(entries, str):
        return {}
    digests = {str(directory / e["path"]): entry_digest(e) for e in entries}
    return {path: digest for path, digest in digests.items() if digest.algorithm != _LEGACY_CHECKSUM}


def checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every sealed-looking checkpoint, newest first (not yet verified); a replaced one renamed
    aside counts only when a crash left no checkpoint of its step."""
    if not root.is_dir():
        return []
    found = {int(m.group(1)): p for p in root.iterdir() if (m := _DIR.match(p.name)) and p.is_dir()}
    for p in root.iterdir():
        if (m := _ASIDE.match(p.name)) and p.is_dir():
            found.setdefault(int(m.group(1)), p)
    return sorted(found.items(), reverse=True)


def latest_valid(root: Path, *, warn: bool = True, checksums: bool = True, defer_rank_files: bool = False,
                 below: int | None = None) -> tuple[int, Path] | None:
    """The newest checkpoint (of a step before `below`, if given) that verifies; damaged newer ones are skipped with a
    warning. The login node passes `checksums=False` (manifest and sizes only); the trainer checks every checksum
    once: before it loads, or for rank files while it loads them (`defer_rank_files`, see verify)."""
    for step, directory in checkpoints(root):
        if below is not None and step >= below:
            continue
        problem = verify(directory, checksums=checksums, defer_rank_files=defer_rank_files)
        if problem is None:
            return step, directory
        if warn:
            message = f"recover checkpoint {directory} is damaged ({problem}); using an older one"
            logger.warning(message)
            print(f"rlkit train: WARNING: {message}", flush=True)
    return None


def temp_dir(root: Path, step: int) -> Path:
    return root / f".step-{step:08d}.tmp"
