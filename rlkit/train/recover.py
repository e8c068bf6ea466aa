"""Crash-safe recover checkpoints: everything needed to continue a trial at the next step, whatever its algorithm.

Layout under `<trial>/recover/`:
  step-00000012/            one checkpoint, complete (made current by the rename from its temp name)
    model_optim/<engine>/   torch.distributed.checkpoint of each engine's sharded model and optimizer ("actor",
                            "critic", ...; every rank writes)
    trainer_state.json      step, each engine's LR-schedule position, RNG states, the algorithm's own state (GRPO:
                            weight version, data position)
    MANIFEST.json           written last: every file with its size and xxh3-128 checksum
  .step-00000013.tmp/       a checkpoint being written (ignored, removed by the next save)
  .step-00000012.old/       a same-step checkpoint being replaced (used only if the crash left no step-00000012/)

A checkpoint counts only when its MANIFEST.json exists and every file matches it; a damaged newest checkpoint is
skipped with a warning and the previous one is used. The newest `keep_last` valid checkpoints are kept.

Checksums are xxh3-128 (xxhash, ~17 GB/s, vs ~1 GB/s for sha256): they guard against torn or damaged files, not
against an attacker (the trial directory is 0700). The shards' checksums are computed while they are written
(`rlkit.train.hashing_fs`), the small files' when sealing. They are checked once, on the compute node, before a
checkpoint is loaded; the login node (submit, resume, render) checks manifests and sizes only, so it never reads
GBs and never needs xxhash. Manifests of older rlkit versions (sha256) still load, at sha256 speed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import random
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlkit.errors import StepError
from rlkit.fsutil import fsync_dir, fsync_path, replace_dir

logger = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
STATE = "trainer_state.json"
SHARDS = "model_optim"
_DIR = re.compile(r"^step-(\d{8})$")
_ASIDE = re.compile(r"^\.step-(\d{8})\.old$")  # rlkit.fsutil.replace_dir's name for the replaced one
_TMP = re.compile(r"^\.step-(\d{8})\.tmp$")
CHECKSUM = "xxh3_128"
_LEGACY_CHECKSUM = "sha256"


@dataclass
class LoopState:
    """What the training loop needs besides weights and optimizer moments to continue exactly."""

    step: int  # last finished step
    engines: dict[str, int] = field(default_factory=dict)  # optimizer steps (LR-schedule position) by engine name
    algorithm: dict[str, Any] = field(default_factory=dict)  # the algorithm's own state (JSON)
    rng: dict[str, Any] = field(default_factory=dict)
    saved_at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LoopState:
        return cls(**json.loads(text))


def check_engines(state: LoopState, names: list[str], directory: Path) -> None:
    """StepError unless the checkpoint holds every engine the algorithm has (by name), before anything is loaded."""
    missing = [name for name in names if name not in state.engines]
    if missing:
        raise StepError(f"recover checkpoint {directory} has no {', '.join(map(repr, missing))} engine (it has: "
                        f"{', '.join(state.engines) or 'none'}); it was written by another job type")


def shards_dir(checkpoint: Path, engine: str) -> Path:
    """Where the engine called `engine` has its shards inside a checkpoint directory."""
    return checkpoint / SHARDS / engine


def compress_positions(done: set[int]) -> tuple[int, list[int]]:
    """{0, 1, 2, 5} -> (3, [5]): the contiguous prefix length and the positions beyond it."""
    prefix = 0
    while prefix in done:
        prefix += 1
    return prefix, sorted(p for p in done if p > prefix)


def expand_positions(prefix: int, extra: list[int]) -> set[int]:
    return set(range(prefix)) | set(extra)


def recover_root(trial_dir: Path) -> Path:
    return Path(trial_dir) / "recover"


def checkpoint_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def file_checksum(path: Path, algorithm: str = CHECKSUM) -> str:
    """The hex digest of a file (xxh3_128, or sha256 for manifests of older rlkit versions)."""
    if algorithm == CHECKSUM:
        import xxhash  # trainer extra; the login node never hashes

        digest: Any = xxhash.xxh3_128()
    elif algorithm == _LEGACY_CHECKSUM:
        digest = hashlib.sha256()
    else:
        raise ValueError(f"unknown checksum {algorithm!r}")
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size:  # mapped, not copied: the check costs about half a plain read
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                digest.update(mapped)
    return str(digest.hexdigest())


def seal(tmp: Path, final: Path, known: Mapping[str, tuple[int, str]] | None = None) -> None:
    """Checksum and fsync every file of `tmp`, write its manifest last, then make it `final`; a `final` that exists
    (the same step saved again after a resume) is replaced by rename-aside, rename-in, delete. `known`: (size,
    xxh3-128) by path of files checksummed while they were written (the shards); the rest is hashed here."""
    files = sorted(p for p in tmp.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = []
    for path in files:
        fsync_path(path)
        size = path.stat().st_size
        written = (known or {}).get(str(path))
        digest = written[1] if written is not None and written[0] == size else file_checksum(path)
        entries.append({"path": str(path.relative_to(tmp)), "size": size, CHECKSUM: digest})
    for directory in sorted({p.parent for p in files} | {tmp}):
        fsync_dir(directory)
    manifest = tmp / MANIFEST
    manifest.write_text(json.dumps({"files": entries, "sealed_at": time.time()}, indent=1))
    fsync_path(manifest)
    fsync_dir(tmp)
    replace_dir(tmp, final)


def _manifest_entries(directory: Path) -> list[dict[str, Any]] | str:
    """The manifest's file entries, or what is wrong with the manifest (it is read as untrusted input)."""
    try:
        entries = json.loads((directory / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"no readable {MANIFEST} ({type(exc).__name__})"
    if not isinstance(entries, list):
        return f"{MANIFEST} has no list of files"
    for entry in entries:
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str) and isinstance(entry.get("size"), int)
                and any(isinstance(entry.get(a), str) for a in (CHECKSUM, _LEGACY_CHECKSUM))):
            return f"{MANIFEST} has a malformed entry: {str(entry)[:120]}"
        if ".." in Path(entry["path"]).parts or Path(entry["path"]).is_absolute():
            return f"{MANIFEST} names a file outside the checkpoint: {entry['path']}"
    return entries


def verify(directory: Path, *, checksums: bool = True) -> str | None:
    """None when `directory` is a complete checkpoint; else what is wrong with it. Without `checksums` only the
    manifest, the files and their sizes are checked (cheap: the login node, pruning); with them every byte is read
    (the compute node, once before loading)."""
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
        algorithm = CHECKSUM if isinstance(entry.get(CHECKSUM), str) else _LEGACY_CHECKSUM
        if file_checksum(directory / entry["path"], algorithm) != entry[algorithm]:
            return f"{entry['path']} does not match its {algorithm} checksum"
    return None


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


def latest_valid(root: Path, *, warn: bool = True, checksums: bool = True) -> tuple[int, Path] | None:
    """The newest checkpoint that verifies; damaged newer ones are skipped with a warning. The login node passes
    `checksums=False` (manifest and sizes only); the trainer checks every checksum once, before it loads."""
    for step, directory in checkpoints(root):
        problem = verify(directory, checksums=checksums)
        if problem is None:
            return step, directory
        if warn:
            message = f"recover checkpoint {directory} is damaged ({problem}); using an older one"
            logger.warning(message)
            print(f"rlkit train: WARNING: {message}", flush=True)
    return None


def prune(root: Path, keep_last: int) -> list[Path]:
    """Remove all but the newest `keep_last` valid checkpoints, damaged ones, and stale temp directories."""
    removed: list[Path] = []
    kept = 0
    for _step, directory in checkpoints(root):
        if kept < keep_last and verify(directory, checksums=False) is None:  # loading re-checks the sums
            kept += 1
            continue
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(directory)
    kept_dirs = {p for _step, p in checkpoints(root)}
    for p in root.iterdir() if root.is_dir() else []:
        if _TMP.match(p.name) or (_ASIDE.match(p.name) and p not in kept_dirs):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def temp_dir(root: Path, step: int) -> Path:
    return root / f".step-{step:08d}.tmp"


def rng_state() -> dict[str, Any]:
    import torch

    return {"python": random.getstate(), "torch": torch.get_rng_state().tolist()}


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
