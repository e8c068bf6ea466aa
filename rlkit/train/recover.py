"""Crash-safe recover checkpoints: everything needed to continue a GRPO trial at the next step.

Layout under `<trial>/recover/`:
  step-00000012/            one checkpoint, complete (made current by the rename from its temp name)
    model_optim/            torch.distributed.checkpoint of the sharded model and optimizer (every rank writes)
    trainer_state.json      step, epoch, weight version, data position, LR-schedule position, RNG states
    MANIFEST.json           written last: every file with its size and sha256
  .step-00000013.tmp/       a checkpoint being written (ignored, removed by the next save)

A checkpoint counts only when its MANIFEST.json exists and every file matches it; a damaged newest checkpoint is
skipped with a warning and the previous one is used. The newest `keep_last` valid checkpoints are kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlkit.fsutil import fsync_dir, fsync_path

logger = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
STATE = "trainer_state.json"
SHARDS = "model_optim"
_DIR = re.compile(r"^step-(\d{8})$")
_TMP = re.compile(r"^\.step-(\d{8})\.tmp$")


@dataclass
class TrainerState:
    """What the step loop needs besides weights and optimizer moments to continue exactly."""

    step: int  # last finished step
    version: int  # weight version the servers had after that step
    consumed_prefix: int = 0  # prompt-stream positions 0..consumed_prefix-1 were trained on ...
    consumed_extra: list[int] = field(default_factory=list)  # ... and these later ones (async runs)
    optimizer_steps: int = 0  # position in the LR schedule
    saver_last_time: float = 0.0
    rng: dict[str, Any] = field(default_factory=dict)
    saved_at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TrainerState:
        return cls(**json.loads(text))


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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def seal(tmp: Path, final: Path) -> None:
    """Fsync every file of `tmp`, write its manifest last, then rename it to `final` (atomic on one filesystem)."""
    files = sorted(p for p in tmp.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = []
    for path in files:
        fsync_path(path)
        entries.append({"path": str(path.relative_to(tmp)), "size": path.stat().st_size, "sha256": _sha256(path)})
    for directory in sorted({p.parent for p in files} | {tmp}):
        fsync_dir(directory)
    manifest = tmp / MANIFEST
    manifest.write_text(json.dumps({"files": entries, "sealed_at": time.time()}, indent=1))
    fsync_path(manifest)
    fsync_dir(tmp)
    os.replace(tmp, final)
    fsync_dir(final.parent)


def verify(directory: Path, *, checksums: bool = True) -> str | None:
    """None when `directory` is a complete checkpoint; else what is wrong with it. Without `checksums` only the
    manifest, the files and their sizes are checked (cheap: for pruning, not for loading)."""
    manifest = directory / MANIFEST
    try:
        entries = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError) as exc:
        return f"no readable {MANIFEST} ({type(exc).__name__})"
    for entry in entries:
        path = directory / entry["path"]
        if not path.is_file():
            return f"{entry['path']} is missing"
        if path.stat().st_size != entry["size"]:
            return f"{entry['path']} has {path.stat().st_size} bytes, the manifest says {entry['size']}"
        if checksums and _sha256(path) != entry["sha256"]:
            return f"{entry['path']} does not match its checksum"
    if not (directory / STATE).is_file():
        return f"{STATE} is missing"
    return None


def checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every sealed-looking checkpoint, newest first (not yet verified)."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _DIR.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def latest_valid(root: Path, *, warn: bool = True) -> tuple[int, Path] | None:
    """The newest checkpoint that verifies; damaged newer ones are skipped with a warning."""
    for step, directory in checkpoints(root):
        problem = verify(directory)
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
    for p in root.iterdir() if root.is_dir() else []:
        if _TMP.match(p.name):
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
