"""Trainer rank 0's end of a vLLM server's weight-broadcast group (`VllmBackend.open_weight_link`).

gloo (CPU): a TCPStore on the trainer's node, `PrefixStore(group_name)` and a `ProcessGroupGloo` of rank 0, as
rlkit's gloo engine in the workers builds its end (rlkit.servers.vllm.gloo_engine). NCCL (GPUs): vLLM's own trainer
helper (`nccl_common.trainer_init`), as vLLM's NCCL engine expects, its broadcasts on a stream of their own; run on
one H200 with another real NCCL communicator in vLLM's place (bench/gpu_nccl_deadline.py), never with vLLM's. NCCL
collectives have no timeout of their own, so every wait of both (the join, each broadcast) goes through the same
deadline code (rlkit.servers.deadline: a completion test polled against the group's timeout, the
communicator aborted on expiry), which the CPU tests exercise over gloo.

How a bucket travels is the wire format of rlkit.servers.vllm.wire: packed into flat byte chunks on NCCL (vLLM's
default), tensor by tensor on gloo, every send issued at once and then waited for. One group holds every server of
a push (rlkit.weights.xccl): on NCCL rank 0 broadcasts (NCCL pipelines it, about one copy from the root); on gloo the
group is a chain and rank 0 sends to rank 1 only (rlkit.servers.vllm.relay; gloo's own broadcast would send
ceil(log2(world)) copies). `copies` says how many copies of each byte rank 0 sends.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from rlkit.servers.backend import WeightGroup
from rlkit.servers.deadline import call_with_deadline, wait_until
from rlkit.servers.vllm.relay import send_chain
from rlkit.servers.vllm.wire import PACKED_BUFFER_BYTES, default_packed, default_relay, packed_chunks

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
    copies = 1  # the chain's rank 0 sends every byte once, to rank 1 only

    def __init__(self, group: WeightGroup, relay: bool) -> None:
        import torch.distributed as dist

        self.timeout_s, self.what = group.timeout_s, f"weight group {group.group_name}"
        self.relay = relay
        if not self.relay:  # gloo's broadcast: a binomial tree, whose root sends one copy per level
            self.copies = max(1, math.ceil(math.log2(group.world_size)))
        self.timeout = timedelta(seconds=group.timeout_s)
        self.store = dist.TCPStore(group.master_address, group.master_port, group.world_size, is_master=True,
                                   timeout=self.timeout, wait_for_workers=False)
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore(group.group_name, self.store), 0, group.world_size,
                                        self.timeout)

    def send(self, payload: list[torch.Tensor]) -> None:
        if self.relay:  # to rank 1 only; the servers forward it down the chain
            send_chain(self.pg, payload, self.timeout_s, f"{self.what} to rank 1", on_expiry=self.close)
            return
        for handle in [self.start(tensor) for tensor in payload]:
            self.wait(handle)

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
    copies = 1  # NCCL pipelines a broadcast along a ring or chain: the root sends about one copy

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

    def send(self, payload: list[torch.Tensor]) -> None:
        for handle in [self.start(tensor) for tensor in payload]:
            self.wait(handle)

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
                 nccl_join: NcclJoin = _vllm_trainer_init, relay: bool | None = None) -> None:
        # what broadcast.init_info told the workers (the same defaults there); tests and the bench set them
        self.packed = default_packed(group.backend) if packed is None else packed
        relay = default_relay(group.backend) if relay is None else relay
        self._end: _Gloo | _Nccl = _Gloo(group, relay) if group.backend == "gloo" else _Nccl(group, nccl_join)
        self.copies = self._end.copies

    def send(self, tensors: list[torch.Tensor]) -> None:
        """Issue every send of the bucket at once (the workers post theirs at once too), then wait for each."""
        self._end.send(_payload(tensors, self.packed))

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
