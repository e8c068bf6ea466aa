"""Crash-safe recover checkpoints: everything needed to continue a trial at the next step, whatever its algorithm.

Layout under `<trial>/recover/`:
  step-00000012/            one checkpoint, complete (made current by the rename from its temp name)
    model_optim/<engine>/   each engine's sharded model and optimizer ("actor", "critic", ...): one file per rank,
                            rank-00000-of-00002.safetensors (rlkit.trainer.rank_files; a torch.distributed.checkpoint
                            in checkpoints of older rlkit versions, which still load)
    trainer_state.json      step, each engine's LR-schedule position, RNG states, the algorithm's own state (GRPO:
                            weight version, data position)
    MANIFEST.json           written last: every file with its size and checksum (xxh3-128; a rank file's over its
                            2 MiB blocks' digests)
  .step-00000013.tmp/       a checkpoint being written (ignored, removed by the next save)
  .step-00000012.old/       a same-step checkpoint being replaced (used only if the crash left no step-00000012/)

A checkpoint counts only when its MANIFEST.json exists and every file matches it; a damaged newest checkpoint is
skipped with a warning and the previous one is used. The newest `keep_last` valid checkpoints are kept.

Checksums are xxh3-128 (xxhash, ~17 GB/s, vs ~1 GB/s for sha256): they guard against torn or damaged files, not
against an attacker (the trial directory is 0700). The rank files' checksums are computed while they are written
(`rlkit.trainer.rank_files`, by blocks, so that a load reads and hashes blocks on every core), the small files' when
sealing. They are checked once, on the compute node: the small files (and the shards of older versions) before a
checkpoint is loaded, each rank file in the same pass that loads it
(a damaged one makes the resume use the previous checkpoint, as a damaged file found before loading does); the login
node (submit, resume, render) checks manifests and sizes only, so it never reads
GBs and never needs xxhash. Manifests of older rlkit versions (sha256) still load, at sha256 speed.

Reading the layout (finding, verifying checkpoints) is in rlkit.trials.recover_layout, which the login node imports
without the trainer; its names are re-exported here for the trainer's code.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from rlkit import untrusted_json
from rlkit.errors import StepError
from rlkit.fsutil import fsync_dir, fsync_path, replace_dir
from rlkit.trials.recover_layout import _ASIDE as _ASIDE
from rlkit.trials.recover_layout import _TMP as _TMP
from rlkit.trials.recover_layout import BLOCK_CHECKSUM as BLOCK_CHECKSUM
from rlkit.trials.recover_layout import CHECKSUM as CHECKSUM
from rlkit.trials.recover_layout import MANIFEST as MANIFEST
from rlkit.trials.recover_layout import SHARDS as SHARDS
from rlkit.trials.recover_layout import STATE as STATE
from rlkit.trials.recover_layout import FileDigest as FileDigest
from rlkit.trials.recover_layout import checkpoint_dir as checkpoint_dir
from rlkit.trials.recover_layout import checkpoints as checkpoints
from rlkit.trials.recover_layout import file_checksum as file_checksum
from rlkit.trials.recover_layout import latest_valid as latest_valid
from rlkit.trials.recover_layout import manifest_digests as manifest_digests
from rlkit.trials.recover_layout import recover_root as recover_root
from rlkit.trials.recover_layout import temp_dir as temp_dir
from rlkit.trials.recover_layout import verify as verify


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
    def from_json(cls, text: str | bytes) -> LoopState:
        """The state `to_json` wrote. ValueError when `text` is not JSON (every rlkit writes JSON: the file is
        damaged); StateUnreadable when it is JSON of another shape (an older rlkit's, or altered)."""
        data = untrusted_json.loads(text)
        problem = _state_problem(data)
        if problem is not None:
            raise StateUnreadable(problem)
        return cls(**data)


class StateUnreadable(ValueError):
    """A trainer state that is JSON, but not of the shape this rlkit writes."""


def _state_problem(data: Any) -> str | None:
    """What makes `data` no LoopState of this rlkit (a wrong type would fail later, far from the file), or None."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    unknown = sorted(set(data) - {f.name for f in fields(LoopState)})
    if unknown:
        return f"unknown fields {', '.join(unknown)}"
    if type(data.get("step")) is not int:
        return f"step {data.get('step')!r} is not a whole number"
    engines = data.get("engines", {})
    if not isinstance(engines, dict) or not all(type(v) is int for v in engines.values()):
        return f"engines {str(engines)[:100]} is not a table of optimizer steps"
    for name in ("algorithm", "rng"):
        if not isinstance(data.get(name, {}), dict):
            return f"{name} is not an object"
    if type(data.get("saved_at", 0.0)) not in (int, float):
        return "saved_at is not a number"
    return None


def read_state(directory: Path) -> LoopState:
    """The checkpoint's trainer state; StepError naming the file and what to do when it cannot be read, telling a
    damaged file (not JSON) from one of another rlkit (JSON of another shape)."""
    path = directory / STATE
    try:
        return LoopState.from_json(path.read_bytes())
    except OSError as exc:
        raise StepError(f"cannot read {path}: {exc}") from None
    except StateUnreadable as exc:
        raise StepError(f"{path} is not a trainer state this rlkit reads ({exc}): an older rlkit wrote it, or it was "
                        "altered after it was written; start a new trial (or set recover.mode=disabled)") from None
    except ValueError as exc:
        raise StepError(f"{path} is damaged: it is not JSON ({exc}), which every rlkit writes there; remove {directory}"
                        " to resume from the checkpoint before it (or set recover.mode=disabled)") from None


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


def seal(tmp: Path, final: Path, known: Mapping[str, FileDigest] | None = None) -> None:
    """Checksum and fsync every file of `tmp`, write its manifest last, then make it `final`; a `final` that exists
    (the same step saved again after a resume) is replaced by rename-aside, rename-in, delete. `known`: size and
    checksum by path of files checksummed while they were written (the rank files); the rest is hashed here."""
    files = sorted(p for p in tmp.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = []
    for path in files:
        fsync_path(path)
        size = path.stat().st_size
        written = (known or {}).get(str(path))
        if written is None or written.size != size:
            written = FileDigest(size, CHECKSUM, file_checksum(path))
        entries.append({"path": str(path.relative_to(tmp)), "size": size, written.algorithm: written.digest})
    for directory in sorted({p.parent for p in files} | {tmp}):
        fsync_dir(directory)
    manifest = tmp / MANIFEST
    manifest.write_text(json.dumps({"files": entries, "sealed_at": time.time()}, indent=1))
    fsync_path(manifest)
    fsync_dir(tmp)
    replace_dir(tmp, final)


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
