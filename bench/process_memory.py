"""Resident memory of this process, for the benches that measure a step's memory in a fresh child process
(bench_head_memory.py, bench_ulysses.py): the peak over the child's start is what the step itself took."""

from __future__ import annotations

import os
import resource


def rss_bytes() -> int:
    """Resident memory now (/proc/self/statm)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
