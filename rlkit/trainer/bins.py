"""Sequences into balanced bins by their real tokens (issue 46, parts 1 and 2): micro-batches of a packed forward,
and a minibatch's shares over the trainer ranks. Pure Python (no torch, no distributed).

A packed micro-batch costs the sum of its sequences' lengths, not (rows x longest), so a bin is balanced by tokens.
Two algorithms, AReaL's `packing_algorithm` names: ffd (longest first, each into the bin with the fewest tokens so far:
greedy, near-balanced) and kk (Karmarkar-Karp's largest differencing: better balance on skewed lengths). Both are
deterministic, and every bin keeps its items in their original order (as the padded path's micro-batches do).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from rlkit.config.schema.actor import PACKING_ALGORITHMS


def _greedy(costs: Sequence[int], count: int) -> list[list[int]]:
    bins: list[list[int]] = [[] for _ in range(count)]
    loads = [(0, b) for b in range(count)]  # a heap of (tokens, bin)
    for i in sorted(range(len(costs)), key=lambda j: (-costs[j], j)):
        load, b = heapq.heappop(loads)
        bins[b].append(i)
        heapq.heappush(loads, (load + costs[i], b))
    return bins


def _karmarkar_karp(costs: Sequence[int], count: int) -> list[list[int]]:
    """k-way largest differencing: repeatedly merge the two partitions whose spreads are largest, the heaviest bin of
    one with the lightest of the other, until one partition is left."""
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    for i in range(len(costs)):
        parts = [(costs[i], [i])] + [(0, []) for _ in range(count - 1)]
        heapq.heappush(heap, (-costs[i], i, parts))  # spread of a one-item partition: its cost
    while len(heap) > 1:
        _, tie, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        a.sort(key=lambda part: part[0])
        b.sort(key=lambda part: -part[0])
        merged = [(x[0] + y[0], x[1] + y[1]) for x, y in zip(a, b, strict=True)]
        loads = [load for load, _ in merged]
        heapq.heappush(heap, (-(max(loads) - min(loads)), tie, merged))
    return [items for _, items in heap[0][2]] if heap else [[] for _ in range(count)]


def balanced_bins(costs: Sequence[int], count: int, *, algorithm: str = "ffd") -> list[list[int]]:
    """Indices of `costs` in `count` bins of about equal total cost (some may be empty when there are fewer items),
    each bin's indices in increasing order."""
    if algorithm not in PACKING_ALGORITHMS:
        raise ValueError(f"unknown packing_algorithm {algorithm!r} (ffd or kk)")
    if count < 1:
        raise ValueError(f"at least one bin, got {count}")
    bins = _greedy(costs, count) if algorithm == "ffd" else _karmarkar_karp(costs, count)
    return [sorted(b) for b in bins]


def packed_micro_batches(costs: Sequence[int], *, max_tokens: int | None, n_mbs: int = 1, divisor: int = 1,
                         algorithm: str = "ffd") -> list[list[int]]:
    """Indices of `costs` (each item's real tokens) in micro-batches, AReaL's mb_spec: at least `n_mbs` of them, a
    multiple of `divisor`, each at most `max_tokens` real tokens (an item larger than that alone in its own), as few
    as that allows, balanced by tokens. Never an empty micro-batch: fewer items than asked give one each."""
    if not costs:
        return []
    count = max(1, n_mbs)
    if max_tokens is not None:  # a lower bound: the tokens need at least this many bins
        count = max(count, -(-sum(costs) // max_tokens))
    step = max(1, divisor)
    while True:
        count = -(-count // step) * step
        bins = [b for b in balanced_bins(costs, min(count, len(costs)), algorithm=algorithm) if b]
        over = max_tokens is not None and any(len(b) > 1 and sum(costs[i] for i in b) > max_tokens for b in bins)
        if not over or count >= len(costs):
            return sorted(bins, key=lambda b: b[0])
        count += 1


def rank_shares(costs: Sequence[int], world: int, *, algorithm: str = "ffd") -> list[list[int]]:
    """A minibatch's items over `world` ranks by tokens (each rank's share within a few percent of the mean when the
    items allow it); a rank may get nothing when there are fewer items than ranks."""
    return balanced_bins(costs, world, algorithm=algorithm)
