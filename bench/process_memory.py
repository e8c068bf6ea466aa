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


def image_peak_rss_bytes() -> int:
    """Peak resident memory of this process image (/proc/self/status VmHWM). Unlike ru_maxrss it does not start at the
    parent's resident memory: Linux carries the forking parent's high-water mark across exec into ru_maxrss, so a
    child started by a large parent reads the parent's size as its own peak."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak_rss() -> None:
    """Set this process's VmHWM to its resident memory now (/proc/self/clear_refs, 5): a peak read later is the peak
    since this call."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
