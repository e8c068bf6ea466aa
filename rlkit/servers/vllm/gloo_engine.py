"""vLLM weight-transfer engine `gloo`: vLLM's broadcast protocol over a gloo group, so weight sync by broadcast runs
on the CPU (CI, the dev cluster) with the same HTTP calls and the same trainer-side steps as vLLM's `nccl` engine.

Registered by rlkit's vLLM general plugin (`rlkit.servers.vllm.plugin`); selected with
`--weight-transfer-config '{"backend": "gloo"}'`. Runs inside every vLLM worker. The wire format follows the NCCL
engine's (read in vLLM 0.32, `distributed/weight_transfer/nccl_engine.py`), so `rlkit.servers.vllm.broadcast` and
`rlkit.weights.xccl` are the same for both:

- join: TCPStore client at (master_address, master_port), a PrefixStore(group_name), a ProcessGroupGloo with rank
  `rank_offset + worker rank`; every operation gives up after `timeout_s`. A new join (the trainer restarted or
  re-formed the group) replaces the old group instead of failing.
- each `/update_weights` call: the listed tensors, sent by rank 0 in order, either packed (flat byte chunks cut
  by `packed_chunks`) or tensor by tensor (rlkit's default on gloo: `wire.default_packed` says why). With `relay`
  (rlkit's default on gloo: `wire.default_relay`) the group is a chain over every server of the push: each rank
  receives from the previous one and forwards to the next (rlkit.servers.vllm.relay), so the trainer sends one copy
  for all servers; without it, one gloo broadcast per buffer. All receives are posted at once, so loading overlaps
  receiving. A tensor loaded already in this update is received (and forwarded) but not loaded again: the trainer
  sends a failed bucket again to the servers that survive the failure (rlkit.weights.xccl).
- start/finish: vLLM's layerwise reload, as the NCCL engine does; finish then repairs tied layers (the same repair as
  the disk path: `rlkit.servers.vllm.worker`, whose docstring says why the reload leaves a tied head stale). vLLM ends
  its update session when a bucket fails; the engine keeps its reload open until the next bucket, which resumes it
  (the same push, named in every bucket's `push`) or closes it and begins anew (another push: a trainer that died
  mid-push).
- a run with deltas (`actor.weight_update_delta`): each bucket names its push's header (`delta`); the engine keeps a
  copy of the pushed weights, applies each delta to it and loads the whole tensors it completes
  (rlkit.servers.weight_delta; the trainer's finish makes the copy that push's).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from rlkit.servers.vllm.relay import ChainReceiver
from rlkit.servers.vllm.wire import PACKED_BUFFER_BYTES, PACKED_NUM_BUFFERS, packed_chunks
from rlkit.servers.vllm.worker import TiedMember, refresh_tied_groups, tied_parameter_groups
from rlkit.servers.weight_delta import DeltaBase, DeltaHeader

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.weight_transfer import WeightTransferConfig

logger = logging.getLogger("vllm.rlkit_gloo_engine")  # under vLLM's logger: its handlers print it in the server log


@dataclass(kw_only=True)
class GlooWeightTransferInitInfo(WeightTransferInitInfo):
    """The NCCL engine's init fields (TCP rendezvous only) plus the group's store prefix and its timeout."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "rlkit-weights"
    timeout_s: float = 300.0
    packed: bool = False
    packed_buffer_size_bytes: int = PACKED_BUFFER_BYTES
    packed_num_buffers: int = PACKED_NUM_BUFFERS  # accepted for parity with NCCL; gloo has no streams to overlap
    relay: bool = False  # a chain (rlkit.servers.vllm.relay) instead of gloo's broadcast: see wire.default_relay

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.world_size < 2 or self.rank_offset < 1 or self.packed_buffer_size_bytes <= 0:
            raise ValueError(f"invalid gloo weight-transfer init info: {self}")


@dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    """The NCCL engine's update fields. `discard` receives the bytes and drops them: the transport floor that
    bench/bench_xccl.py measures (no load), never used by a weight sync."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    discard: bool = False
    push: str = ""  # the trainer's name for the push (rlkit.weights.xccl): which loads a resumed update keeps
    delta: dict[str, Any] | None = None  # a push of a run with deltas: its DeltaHeader (rlkit.servers.weight_delta)

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(f"update_info lists differ in length: {len(self.names)} names, "
                             f"{len(self.dtype_names)} dtype_names, {len(self.shapes)} shapes")


@dataclass
class _Group:
    store: dist.Store  # kept referenced for the group's lifetime
    pg: dist.ProcessGroupGloo
    rank: int
    timeout: timedelta
    world_size: int
    name: str = field(default="")


class GlooWeightTransferEngine(WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]):
    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo

    def __init__(self, config: WeightTransferConfig, vllm_config: VllmConfig, device: torch.device,
                 model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self._group: _Group | None = None
        self._packed = False
        self._relay = False
        self._open = False  # a layerwise reload is set up and not finalized
        self._push = ""  # the push whose tensors the open update loaded
        self._loaded: set[str] = set()  # the names loaded in it
        self._buffer_bytes = PACKED_BUFFER_BYTES
        self._tied: list[list[TiedMember]] = []
        self._delta: DeltaBase | None = None  # the copy deltas apply to, kept once a push of a run with deltas came
        self._delta_push = ""  # the push that copy is being updated by

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        self.shutdown()  # a re-join (restarted trainer, re-formed group) replaces the old group
        parallel = self.parallel_config
        rank = parallel.data_parallel_index * parallel.world_size + parallel.rank + init_info.rank_offset
        timeout = timedelta(seconds=init_info.timeout_s)
        start = time.perf_counter()
        store = dist.TCPStore(init_info.master_address, init_info.master_port, init_info.world_size,
                              is_master=False, timeout=timeout)
        prefixed = dist.PrefixStore(init_info.group_name, store)
        pg = dist.ProcessGroupGloo(prefixed, rank, init_info.world_size, timeout)
        self._group = _Group(store=store, pg=pg, rank=rank, timeout=timeout, world_size=init_info.world_size,
                             name=init_info.group_name)
        self._packed = init_info.packed
        self._relay = init_info.relay
        self._buffer_bytes = init_info.packed_buffer_size_bytes
        logger.info("rlkit gloo weight transfer: joined %s at %s:%d as rank %d of %d (%s) in %.2f s",
                    init_info.group_name, init_info.master_address, init_info.master_port, rank, init_info.world_size,
                    "relay" if self._relay else "broadcast", time.perf_counter() - start)

    def start_weight_update(self) -> None:
        """Set up vLLM's layerwise reload, unless an update is still open: vLLM ends its session when a bucket fails
        (its worker's update_weights), and the trainer then starts it again to send that bucket once more. Setting
        the reload up again would put the layers loaded so far back on meta and forget the partly loaded ones'
        progress, so the open update is kept; the next bucket says whether it resumes it (the same push) or
        replaces it (another push: a trainer that died mid-push), see `receive_weights`."""
        if self._open:
            logger.info("rlkit gloo weight transfer: an update of push %s is still open (%d tensors loaded): kept "
                        "until the next bucket", self._push or "?", len(self._loaded))
            return
        self._begin()

    def _begin(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self._tied = tied_parameter_groups(self.model)  # by identity: before the reload replaces tensors by meta
        initialize_layerwise_reload(self.model)
        self._open, self._push, self._loaded = True, "", set()

    def finish_weight_update(self) -> None:
        """The trainer's finish (every bucket of the push loaded): a run with deltas keeps the copy as that push's."""
        if self._delta is not None and self._delta_push:
            self._delta.commit()
            self._delta_push = ""
        self._finalize()

    def _finalize(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        start = time.perf_counter()
        self._open, self._push, self._loaded = False, "", set()
        finalize_layerwise_reload(self.model, self.model_config)
        refreshed = refresh_tied_groups(self._tied)
        logger.info("rlkit gloo weight transfer: update finished in %.3f s (tied layers refreshed: %s)",
                    time.perf_counter() - start, refreshed or "none")

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        group = self._group
        if group is None:
            raise RuntimeError("gloo weight transfer: no group joined; POST /init_weight_transfer_engine first")
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        if self._push and update_info.push != self._push:  # an update another push left open: closed, begun anew
            logger.info("rlkit gloo weight transfer: closing the update push %s left open (%d tensors loaded) for "
                        "push %s", self._push, len(self._loaded), update_info.push or "?")
            self._finalize()  # not the trainer's finish: the copy a delta needs stays of no push
            self._begin()
        self._push = update_info.push
        header = None if update_info.delta is None else DeltaHeader.from_json(update_info.delta)
        if header is not None and self._delta_push != update_info.push:  # the push's first bucket
            self._delta = self._delta or DeltaBase()
            self._delta.begin(header)  # refuses a delta whose base this copy is not
            self._delta_push = update_info.push

        dtypes = [_dtype(name) for name in update_info.dtype_names]
        shapes = [tuple(shape) for shape in update_info.shapes]
        sizes = [_numel(shape) * dtype.itemsize for shape, dtype in zip(shapes, dtypes, strict=True)]
        load = cast("Callable[[list[tuple[str, torch.Tensor]]], object]", self.model.load_weights)
        if self._packed:
            chunks = [list(chunk) for chunk in packed_chunks(sizes, self._buffer_bytes)]
            buffers = [torch.empty(sum(sizes[i] for i in chunk), dtype=torch.uint8, device=self.device)
                       for chunk in chunks]
        else:
            chunks = [[i] for i in range(len(sizes))]
            buffers = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in zip(shapes, dtypes,
                                                                                                    strict=True)]
        start = time.perf_counter()
        waited = loaded = 0.0
        calls = 0
        arrivals = self._arrivals(group, buffers)
        try:
            with disable_mtp_completeness_check():
                while True:
                    mark = time.perf_counter()
                    batch = next(arrivals, None)
                    waited += time.perf_counter() - mark
                    if batch is None:
                        break
                    if update_info.discard:
                        continue
                    mark = time.perf_counter()
                    # a name loaded already in this update is skipped: the trainer sends a failed bucket again
                    # (rlkit.weights.xccl), and a layerwise reload must not count a layer's elements twice
                    arrived = [pair for k in batch
                               for pair in self._unpack(chunks[k], buffers[k], update_info.names, sizes, dtypes,
                                                        shapes)]
                    if header is not None and self._delta is not None:  # deltas applied to the copy: whole tensors
                        arrived = self._delta.take(arrived)
                    pairs = [pair for pair in arrived if pair[0] not in self._loaded]
                    if pairs:
                        load(pairs)
                        self._loaded.update(name for name, _ in pairs)
                        calls += 1
                    loaded += time.perf_counter() - mark
        except BaseException:
            # a broken chain: drop this group now, so the ranks after this one fail at once, not at their timeout
            self.shutdown()
            raise
        logger.info("rlkit gloo weight transfer: %d tensors, %.1f MB (%s%s): %.3f s, of which waiting %.3f s, "
                    "loading %.3f s in %d calls", len(sizes), sum(sizes) / 1e6,
                    "packed" if self._packed else "per tensor", ", relayed" if self._relay else "",
                    time.perf_counter() - start, waited, loaded, calls)

    def _arrivals(self, group: _Group, buffers: list[torch.Tensor]) -> Iterator[list[int]]:
        """The buffers' indices as they arrive, in batches (all that arrived while the last batch was loaded), so
        loading overlaps receiving."""
        if self._relay:  # received from the previous rank, forwarded to the next (rlkit.servers.vllm.relay)
            yield from ChainReceiver(group.pg, group.rank, group.world_size, group.timeout,
                                     group.name).receive(buffers)
            return
        # Every receive is posted at once (gloo runs them in the background, matched to the trainer's sends by
        # order): while one buffer is loaded, the next ones keep arriving.
        works = [group.pg.broadcast(buffer, 0) for buffer in buffers]  # type: ignore[attr-defined]
        first = 0
        while first < len(works):
            _wait(group, works[first], buffers[first].nbytes)
            last = first + 1
            while last < len(works) and works[last].is_completed():  # load what has arrived in one call
                _wait(group, works[last], buffers[last].nbytes)  # raises if it completed with an error
                last += 1
            yield list(range(first, last))
            first = last

    def _unpack(self, chunk: list[int], buffer: torch.Tensor, names: list[str], sizes: list[int],
                dtypes: list[torch.dtype], shapes: list[tuple[int, ...]]) -> list[tuple[str, torch.Tensor]]:
        """The named tensors of one received buffer (views of it)."""
        if not self._packed:
            return [(names[chunk[0]], buffer)]
        parts = buffer.split([sizes[i] for i in chunk])
        return [(names[i], part.view(dtypes[i]).view(shapes[i])) for i, part in zip(chunk, parts, strict=True)]

    def shutdown(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            try:
                group.pg.abort()  # drop the connections now; a peer still waiting fails instead of hanging
            except RuntimeError as exc:  # already broken (the trainer died): nothing left to close
                logger.info("rlkit gloo weight transfer: closing %s: %s", group.name, exc)


def _wait(group: _Group, work: dist.Work, nbytes: int) -> None:
    if not work.wait(group.timeout):
        raise RuntimeError(f"gloo weight transfer: receiving {nbytes} bytes in {group.name} timed out after "
                           f"{group.timeout.total_seconds():g} s")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"gloo weight transfer: unknown dtype name {name!r}")
    return dtype


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


__all__ = ["GlooWeightTransferEngine", "GlooWeightTransferInitInfo", "GlooWeightTransferUpdateInfo"]
