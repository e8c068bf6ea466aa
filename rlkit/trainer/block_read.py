"""Read a file in fixed blocks on several threads, each block straight into the memory its bytes belong in, hashed
while it is still in the reading core's cache.

Why: one thread copying from the page cache (or a parallel file system) and another hashing behind it made a recover
load 1.3-1.5x a plain read on two cores; blocks read and hashed by every core cost less than a plain one-thread read.
The file's checksum is then over the blocks' digests (rlkit.trials.recover_layout.BLOCK_CHECKSUM).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash
from torch import Tensor

_MAX_THREADS = 8
_IOV_PER_CALL = 512  # under Linux's IOV_MAX (1024) for one preadv


@dataclass
class Span:
    """Bytes [start, end) of the file and where they go: `host` (a CPU buffer of exactly end - start bytes, written
    in place), `device` (a contiguous uint8 view of device memory of that length, copied through a pinned buffer), or
    neither (bytes nobody wants, such as the header: read and hashed only)."""

    start: int
    end: int
    host: memoryview | None = None
    device: Tensor | None = None


def reader_threads() -> int:
    """One thread per core this process may run on, at most 8."""
    return max(1, min(_MAX_THREADS, len(os.sched_getaffinity(0))))


def read_blocks(path: Path, spans: list[Span], block: int, threads: int | None = None) -> list[bytes]:
    """Read `path` (whose bytes `spans` cover in order, from 0 to its size) into the spans' memory, on `threads`
    threads taking every n-th block; returns the xxh3-128 digest of each block in file order. The first error any
    thread meets is raised (EOFError when the file is shorter than the spans)."""
    size = spans[-1].end if spans else 0
    count = -(-size // block)
    digests: list[bytes] = [b""] * count
    errors: list[BaseException] = []
    workers = max(1, min(threads or reader_threads(), count))
    device = next((s.device.device for s in spans if s.device is not None), None)
    fd = os.open(path, os.O_RDONLY)
    pool: list[threading.Thread] = []
    try:
        def work(first: int) -> None:
            try:
                if device is not None and device.type == "cuda":
                    torch.cuda.set_device(device)  # a new thread's current device is 0
                staging = torch.empty(block, dtype=torch.uint8, pin_memory=device is not None)
                cursor = 0
                for index in range(first, count, workers):
                    if errors:
                        return
                    cursor = _first_span(spans, index * block, cursor)
                    digests[index] = _read_block(fd, spans, cursor, index * block, min(size, (index + 1) * block),
                                                 staging)
            except BaseException as exc:  # handed to the caller's thread
                errors.append(exc)

        for k in range(workers):
            pool.append(threading.Thread(target=work, args=(k,), name=f"rlkit-read-{k}", daemon=True))
            pool[-1].start()
        for thread in pool:
            thread.join()
    finally:
        if any(thread.is_alive() for thread in pool):  # interrupted: stop them before their fd can be reused
            errors.append(InterruptedError("the read was interrupted"))
            for thread in pool:
                thread.join()
        os.close(fd)
    if errors:
        raise errors[0]
    return digests


def _first_span(spans: list[Span], at: int, cursor: int) -> int:
    """The index of the span holding byte `at`, searching on from `cursor` (a thread's blocks only move forward)."""
    while spans[cursor].end <= at:
        cursor += 1
    return cursor


def _read_block(fd: int, spans: list[Span], cursor: int, begin: int, end: int, staging: Tensor) -> bytes:
    """Read bytes [begin, end) into their spans' memory (the rest through `staging`), then hash them in order."""
    views: list[memoryview] = []
    to_device: list[tuple[Tensor, int, int]] = []  # (device view, staging offset, bytes)
    staged = staging.numpy().data
    at = begin
    while at < end:
        span = spans[cursor]
        stop = min(end, span.end)
        if span.host is not None:
            views.append(span.host[at - span.start:stop - span.start])
        else:
            views.append(staged[at - begin:stop - begin])
            if span.device is not None:
                to_device.append((span.device[at - span.start:stop - span.start], at - begin, stop - at))
        at = stop
        cursor += 1 if stop == span.end else 0
    _preadv_all(fd, views, begin)
    digest = xxhash.xxh3_128()
    for view in views:
        digest.update(view)
    for target, offset, length in to_device:
        target.copy_(staging[offset:offset + length])  # synchronous: the staging buffer is reused next block
    return bytes(digest.digest())


def _preadv_all(fd: int, views: list[memoryview], offset: int) -> None:
    """Fill every view from `offset` on, in order, however short each preadv returns."""
    pending = deque(v for v in views if len(v))
    while pending:
        got = os.preadv(fd, [pending[k] for k in range(min(len(pending), _IOV_PER_CALL))], offset)
        if got == 0:
            raise EOFError("the file ends early")
        offset += got
        while got:
            if got >= len(pending[0]):
                got -= len(pending.popleft())
            else:
                pending[0] = pending[0][got:]
                got = 0
