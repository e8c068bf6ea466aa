"""Trainer rank 0's end of the weight-broadcast group SGLang's workers join (`POST /init_weights_update_group`).

The group's wire layout is SGLang's, not vLLM's: each SGLang worker calls `init_custom_process_group(backend,
init_method="tcp://{master_address}:{master_port}", world_size, rank=rank_offset + tp_rank, group_name)`
(sglang 0.5.23: `srt/model_executor/model_runner_components/weight_updater.py: init_weights_update_group`, helper in
`srt/utils/common.py`). That helper does torch's `tcp://` rendezvous (rank 0 hosts the TCPStore: here, the trainer),
wraps the store in `PrefixStore(group_name, ...)` and builds the group with torch's `_new_process_group_helper`,
which prefixes the keys again (`{group_name}/`, `{device}/`). A group built any other way (vLLM's
StatelessProcessGroup, a bare ProcessGroupGloo) waits on other store keys and never forms. So this module builds the
trainer's end the same way, with the same private torch helpers SGLang uses; workers receive with
`torch.distributed.broadcast(tensor, src=0, group=...)` per tensor, in the order of the bucket's names. One group
holds every SGLang server of a push (rlkit.weights.xccl), each server's workers at their own `rank_offset`, and
SGLang's own broadcast serves them all: on NCCL the trainer sends about one copy, on gloo ceil(log2(world)) copies
(gloo's binomial tree; no relay here, since the receiving side is SGLang's code, not rlkit's).

Torch is imported inside the functions: config validation imports rlkit.servers without torch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from rlkit.servers.backend import WeightGroup

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup


def open_trainer_group(group: WeightGroup) -> ProcessGroup:
    """Host the group's TCPStore and join as rank 0; returns once every SGLang worker joined (call it while
    `BACKEND.join_weight_group` runs), or raises after `group.timeout_s` (torch's DistStoreError / RuntimeError)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import Backend, GroupName, PrefixStore, _new_process_group_helper, _world

    timeout = timedelta(seconds=group.timeout_s)
    store = dist.TCPStore(group.master_address, group.master_port, group.world_size, is_master=True,
                          timeout=timeout, wait_for_workers=False)
    pg, _ = _new_process_group_helper(group.world_size, 0, [], Backend(group.backend),
                                      PrefixStore(group.group_name, store), group_name=GroupName(group.group_name),
                                      timeout=timeout)
    _world.pg_group_ranks[pg] = {rank: rank for rank in range(group.world_size)}  # as SGLang: group rank == rank
    return pg


def broadcast_bucket(pg: ProcessGroup, tensors: Sequence[torch.Tensor]) -> None:
    """Send one bucket from rank 0, tensor by tensor in order (what `receive_weight_bucket` announced)."""
    import torch.distributed as dist

    for tensor in tensors:
        dist.broadcast(tensor.contiguous(), src=0, group=pg)


def close_trainer_group(pg: ProcessGroup) -> None:
    """Leave the group (torch forgets it, its rank map included); the server leaves by
    `POST /destroy_weights_update_group {"group_name"}`."""
    import torch.distributed as dist

    dist.destroy_process_group(pg)


class SglangWeightLink:
    """`ServerBackend.open_weight_link` for SGLang: joins on construction (every worker, or an error after the
    group's timeout), then sends each bucket tensor by tensor."""

    def __init__(self, group: WeightGroup) -> None:
        self._pg = open_trainer_group(group)
        # rank 0's copies of each byte in SGLang's broadcast: NCCL pipelines it (about one); gloo's is a binomial
        # tree, whose root sends one copy per level (measured: 3 at a world of 5)
        self.copies = 1 if group.backend == "nccl" else max(1, math.ceil(math.log2(group.world_size)))

    def send(self, tensors: list[torch.Tensor]) -> None:
        broadcast_bucket(self._pg, tensors)

    def close(self) -> None:
        abort = getattr(self._pg, "abort", None)  # unblock a send still in the group (forget() runs on failure)
        if abort is not None:
            try:
                abort()
            except RuntimeError as exc:
                logging.getLogger(__name__).debug("aborting an SGLang weight group: %s", exc)
        try:
            close_trainer_group(self._pg)
        except (RuntimeError, ValueError) as exc:  # a group a dead server broke
            logging.getLogger(__name__).debug("closing a broken SGLang weight group: %s", exc)
