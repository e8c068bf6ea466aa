"""Which node and GPUs each step of a running trial holds, for `rlkit status TRIAL`.

Every step prints one line first in its log (rlkit.slurm.jobenv.JobEnv.slice_line; a step over several nodes prints
one per node, and a restarted step prints them again, so the last ones are current). Here they are read back from
the trial's own logs directory only, a bounded number of bytes per log (logs of long runs are large): the end of the
log, where a restart's line is, else its beginning, where the first start's is. What a log says is shown, never
acted on: control characters are dropped and each field is cut short.
"""

from __future__ import annotations

import os
import re
import stat
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from rlkit.slurm.time_limits import slurm_time_seconds
from rlkit.step_contract import NODE_CHECK_STEP, SLICE_MARK

TAIL_BYTES = 256 * 1024  # read from the end of a log first: a restarted step's line is near it
HEAD_BYTES = 64 * 1024  # else from its start: the line a step prints first
MAX_LOGS = 512  # step logs looked at in one trial
MAX_FIELD = 100  # characters of a node name or GPU list shown
CLOCK_SLACK_S = 30  # file times come from the file server's clock, the job's start from the controller's
_LINE = re.compile(rb"^" + re.escape(SLICE_MARK.encode()) + rb" (\S+) on (\S+) holds GPUs (\S+)[ \t\r]*$",
                   re.MULTILINE)


@dataclass(frozen=True)
class NodeSlice:
    """What one step holds on one node: its GPUs as Slurm numbered them ("0,1"), or "none"."""

    node: str
    gpus: str


@dataclass(frozen=True)
class StepSlice:
    """One step and what it holds on each of its nodes."""

    step: str
    nodes: tuple[NodeSlice, ...]

    def text(self) -> str:
        """`step server-0: node1, GPUs 0` (`; ` between the nodes of a step over several)."""
        return f"step {self.step}: " + "; ".join(f"{n.node}, GPUs {n.gpus}" for n in self.nodes)


def shown(text: str) -> str:
    """A field from a log as status prints it: no control (or other non-printing) characters, at most MAX_FIELD
    characters."""
    kept = "".join(c for c in text if unicodedata.category(c)[0] != "C")
    return kept if len(kept) <= MAX_FIELD else kept[:MAX_FIELD - 3] + "..."


def _read(fd: int, offset: int, size: int) -> bytes:
    chunks, done = [], 0
    while done < size:
        chunk = os.pread(fd, size - done, offset + done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


def _slices_in(data: bytes, step: str) -> tuple[NodeSlice, ...]:
    """The last line of `step` on each node in `data`, nodes in the order they first appear."""
    found: dict[str, str] = {}
    for match in _LINE.finditer(data):
        name, node, gpus = (shown(g.decode(errors="replace")) for g in match.groups())
        if name == step:  # a line of another step is not this log's to report
            found[node] = gpus
    return tuple(NodeSlice(node, gpus) for node, gpus in found.items())


def read_slice(log: Path, step: str) -> tuple[NodeSlice, ...]:
    """What `step` holds, from the slice lines of its log `log` (a regular file, not followed through a link): those
    in its last TAIL_BYTES, else those in its first HEAD_BYTES; () when it has none or cannot be read."""
    try:
        fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ()
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ()
        start = max(0, info.st_size - TAIL_BYTES)
        tail = _read(fd, start, info.st_size - start)
        if start:  # the first line read may be cut: it starts after the first newline
            tail = tail[tail.find(b"\n") + 1:] if b"\n" in tail else b""
        found = _slices_in(tail, step)
        if not found and start:
            head = _read(fd, 0, min(HEAD_BYTES, start))
            found = _slices_in(head[:head.rfind(b"\n") + 1], step)  # only whole lines
        return found
    except OSError:
        return ()
    finally:
        os.close(fd)


def _natural(name: str) -> list[tuple[int, int, str]]:
    """server-2 before server-10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def step_slices(logs: Path, *, since: float | None = None) -> list[StepSlice]:
    """Each step's slice, from the `<step>.log` files directly in `logs` (step 0's node check holds no slice);
    `since`: a time (seconds since the epoch) before which a log was last written by an earlier run of the job (a
    requeue, a resume), so its lines are not this run's."""
    try:
        if logs.is_symlink() or not logs.is_dir():
            return []
        entries = sorted((e for e in os.scandir(logs) if e.name.endswith(".log")), key=lambda e: _natural(e.name))
    except OSError:
        return []
    slices = []
    for entry in entries[:MAX_LOGS]:
        step = entry.name.removesuffix(".log")
        if step == NODE_CHECK_STEP:
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            if since is not None and entry.stat(follow_symlinks=False).st_mtime < since - CLOCK_SLACK_S:
                continue
        except OSError:
            continue
        nodes = read_slice(Path(entry.path), step)
        if nodes:
            slices.append(StepSlice(shown(step), nodes))
    return slices


def run_started(elapsed: str, now: float | None = None) -> float | None:
    """When the job's current run started, from Slurm's RunTime (`1-02:03:04`); None when it does not read."""
    try:
        seconds = slurm_time_seconds(elapsed.strip()) if elapsed.strip() else None
    except ValueError:
        return None
    return None if seconds is None else (time.time() if now is None else now) - seconds
