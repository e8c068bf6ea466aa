"""Benchmark of NfsNameResolve: add / get / list_subtree latency with 1,000 entries, against a bare-scandir floor.

Run: ``python bench/bench_nameresolve.py [--root DIR] [--entries N] [--repeats R]``. ``--root`` defaults to a new
temp dir on the local disk; point it at an NFS mount to measure the real thing. Prints figures; asserts nothing.
Goal: list_subtree of 1,000 entries under 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlkit.nameresolve import NfsNameResolve

LIST_GOAL_S = 0.050


def pct(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def row(name: str, samples: list[float], unit: str = "ms") -> None:
    scale = 1e3 if unit == "ms" else 1e6
    print(
        f"  {name:<50} median {statistics.median(samples) * scale:9.3f} {unit}   "
        f"p95 {pct(samples, 0.95) * scale:9.3f} {unit}   (n={len(samples)})"
    )


def floor_scan(directory: str, stem_prefix: str) -> int:
    """The least any lister must do: one scandir and one open+read per matching record file."""
    n = 0
    with os.scandir(directory) as it:
        for entry in it:
            if entry.name.startswith(stem_prefix) and entry.name.endswith(".rec"):
                with open(entry.path, "rb") as f:
                    f.read()
                n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", help="record root (default: a new temp dir, removed afterwards)")
    ap.add_argument("--entries", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=50, help="runs of each list measurement")
    args = ap.parse_args()

    root = args.root or tempfile.mkdtemp(prefix="bench-nameresolve-")
    n = args.entries
    try:
        nr = NfsNameResolve(root, "bench", f"trial-{os.getpid()}", ttl=30.0, heartbeat_interval=5.0)
        nr.clear_subtree("")
        print(f"NfsNameResolve benchmark: {n} entries in {nr.directory}/  (python {sys.version.split()[0]})")

        value = json.dumps({"address": "10.0.0.1:8000", "backend": "vllm", "model": "Qwen/Qwen2.5-7B", "version": 3})
        add_s: list[float] = []
        for i in range(n):
            start = time.perf_counter()
            nr.add(f"servers/{i}", value)
            add_s.append(time.perf_counter() - start)
        replace_s = timed(lambda: nr.add("servers/0", value, replace=True), min(n, 200))
        keepalive_s: list[float] = []
        for i in range(10):
            start = time.perf_counter()
            nr.add(f"others/{i}", value, keepalive=True)
            keepalive_s.append(time.perf_counter() - start)

        keys = [f"servers/{random.randrange(n)}" for _ in range(max(n, 1000))]
        get_s: list[float] = []
        for key in keys:
            start = time.perf_counter()
            nr.get(key)
            get_s.append(time.perf_counter() - start)

        assert len(nr.list_subtree("servers")) == n  # sanity (and warm-up), not a benchmark assertion
        list_s = timed(lambda: nr.list_subtree("servers"), args.repeats)
        list_all_s = timed(lambda: nr.list_subtree(""), args.repeats)
        list_small_s = timed(lambda: nr.list_subtree("others"), args.repeats)
        floor_s = timed(lambda: floor_scan(nr.directory, "servers:"), args.repeats)

        print("per operation:")
        row(f"add (new key, {n} keys)", add_s, "us")
        row("add replace=True", replace_s, "us")
        row("add keepalive=True", keepalive_s, "us")
        row("get", get_s, "us")
        print("listing:")
        row(f"list_subtree('servers') -> {n} entries", list_s)
        row(f"list_subtree('') -> {n + 10} entries", list_all_s)
        row(f"list_subtree('others') -> 10 of {n + 10}", list_small_s)
        row(f"floor: scandir + open/read of the same {n} files", floor_s)
        med_list, med_floor = statistics.median(list_s), statistics.median(floor_s)
        print(f"  list_subtree('servers') / floor (medians): {med_list / med_floor:.2f}x")
        verdict = "met" if med_list < LIST_GOAL_S else "NOT met"
        print(
            f"goal: list_subtree of {n} entries under {LIST_GOAL_S * 1e3:.0f} ms -> {verdict} "
            f"(median {med_list * 1e3:.2f} ms, p95 {pct(list_s, 0.95) * 1e3:.2f} ms)"
        )
        nr.close()
        nr.clear_subtree("")
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
