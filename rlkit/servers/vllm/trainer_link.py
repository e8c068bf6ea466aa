"""Trainer rank 0's end of a vLLM server's weight-broadcast group (`VllmBackend.open_weight_link`).

gloo (CPU): a TCPStore on the trainer's node, `PrefixStore(group_name)` and a `ProcessGroupGloo` of rank 0, as
rlkit's gloo engine in the workers builds its end (rlkit.servers.vllm.gloo_engine). NCCL (GPUs): vLLM's own trainer
helper (`nccl_common.trainer_init`), as vLLM's NCCL engine expects, its broadcasts on a stream of their own; run on
one H200 with another real NCCL communicator in vLLM's place (bench/gpu_nccl_deadline.py), never with vLLM's. NCCL
collectives have no timeout of their own, so every wait of both (the join, each broadcast) goes through the same
deadline code (rlkit.servers.deadline: a completion test polled against the group's timeout, the
communicator aborted on expiry), which the CPU tests exercise over gloo.

How a bucket travels is the wire format of rlkit.servers.vllm.wire: packed into flat byte chunks on NCCL (vLLM's
default), tensor by tensor on gloo, every broadcast issued at once and then waited for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from rlkit.servers.backend import WeightGroup
from rlkit.servers.deadline import call_with_deadline, wait_until
from rlkit.servers.vllm.wire import PACKED_BUFFER_BYTES, default_packed, packed_chunks

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)
# joins an NCCL group as its rank 0 from the rendezvous (master_address, master_port, world_size) and returns the
# communicator: its `broadcast(tensor, src=, stream=)` and `destroy()` (an abort) are what the link uses
NcclJoin = Callable[[dict[str, Any]], Any]


def _vllm_trainer_init(rendezvous: dict[str, Any]) -> Any:
    from vllm.distributed.weight_transfer.nccl_common import trainer_init

    return trainer_init(rendezvous, rank=0)


class _Gloo:
    def __init__(self, group: WeightGroup) -> None:
        import torch.distributed as dist

        self.timeout_s, self.what = group.timeout_s, f"broadcast group {group.group_name}"
        self.timeout = timedelta(seconds=group.timeout_s)
        self.store = dist.TCPStore(group.master_address, group.master_port, group.world_size, is_master=True,
                                   timeout=self.timeout, wait_for_workers=False)
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore(group.group_name, self.store), 0, group.world_size,
                                        self.timeout)

    def start(self, tensor: torch.Tensor) -> Any:
        return self.pg.broadcast(tensor, 0)  # type: ignore[attr-defined]  # the (tensor, root) overload: no stub

    def wait(self, handle: Any) -> None:
        wait_until(handle.is_completed, self.timeout_s, f"a broadcast of {self.what}", on_expiry=self.close)
        handle.wait()  # done: raises the collective's own error, if it failed

    def close(self) -> None:
        try:
            self.pg.abort()
        except RuntimeError as exc:
            logger.debug("closing a broken gloo group: %s", exc)


class _Nccl:
    def __init__(self, group: WeightGroup, join: NcclJoin) -> None:
        import torch

        self.timeout_s, self.what = group.timeout_s, f"NCCL broadcast group {group.group_name}"
        rendezvous = {"master_address": group.master_address, "master_port": group.master_port,
                      "world_size": group.world_size}

        def joined() -> tuple[Any, torch.cuda.Stream]:
            # the broadcasts' own stream, polled by events; made within the deadline, since making a stream waits for
            # the device's running kernels (3.0 s behind a 3 s kernel on an H200: bench/gpu_nccl_deadline.py)
            return join(rendezvous), torch.cuda.Stream()

        self.comm, self.stream = call_with_deadline(joined, group.timeout_s, f"joining {self.what} at "
                                                    f"{group.master_address}:{group.master_port}")

    def start(self, tensor: torch.Tensor) -> Any:
        import torch

        self.stream.wait_stream(torch.cuda.current_stream())  # the bucket's tensors are written first
        self.comm.broadcast(tensor, src=0, stream=self.stream)
        tensor.record_stream(self.stream)
        done = torch.cuda.Event()
        done.record(self.stream)
        return done

    def wait(self, handle: Any) -> None:
        wait_until(handle.query, self.timeout_s, f"a broadcast of {self.what}", on_expiry=self.close)

    def close(self) -> None:
        self.comm.destroy()  # ncclCommAbort (in a thread of its own, bounded): frees the peers' waits too


class VllmWeightLink:
    """Joins on construction (blocks until every worker joined, or raises after the group's timeout). `nccl_join`
    makes the NCCL communicator: vLLM's trainer helper in a job; bench/gpu_nccl_deadline.py hands in another real
    NCCL communicator, since the GPU machine it runs on has no vLLM."""

    def __init__(self, group: WeightGroup, packed: bool | None = None,
                 nccl_join: NcclJoin = _vllm_trainer_init) -> None:
        # what broadcast.init_info told the workers (the same default there); tests and the bench set it
        self.packed = default_packed(group.backend) if packed is None else packed
        self._end: _Gloo | _Nccl = _Gloo(group) if group.backend == "gloo" else _Nccl(group, nccl_join)

    def send(self, tensors: list[torch.Tensor]) -> None:
        """Issue every broadcast of the bucket at once (the workers post theirs at once too), then wait for each."""
        payload = _payload(tensors, self.packed)
        for handle in [self._end.start(tensor) for tensor in payload]:
            self._end.wait(handle)

    def close(self) -> None:
        self._end.close()


def _payload(tensors: list[torch.Tensor], packed: bool) -> list[torch.Tensor]:
    """The bucket as sent: flat byte chunks cut by `packed_chunks` when packed, else the tensors themselves
    (contiguous: a broadcast sends the storage from the first element on)."""
    import torch

    if not packed:
        return [t.detach().contiguous() for t in tensors]
    flat = [t.detach().contiguous().view(-1).view(torch.uint8) for t in tensors]
    return [torch.cat([flat[i] for i in chunk]) if len(chunk) > 1 else flat[chunk[0]]
            for chunk in packed_chunks([f.numel() for f in flat], PACKED_BUFFER_BYTES)]
