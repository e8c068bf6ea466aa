"""vLLM's side of a weight broadcast, over HTTP: the four calls `VllmBackend` makes while trainer rank 0 broadcasts.

vLLM's native weight-transfer routes (`VLLM_SERVER_DEV_MODE=1`, server started with
`--weight-transfer-config '{"backend": "nccl"|"gloo"}'`) each run one `collective_rpc` on every worker and return
when all workers are done, so the receive call must be in flight while the trainer broadcasts:

- `POST /init_weight_transfer_engine {"init_info": {...}}`: the workers join the trainer's group (blocks until the
  trainer joins too). `init_info` is what vLLM's own NCCL trainer engine sends (`NCCLWeightTransferInitInfo`:
  master_address, master_port, rank_offset, world_size, packed, packed_buffer_size_bytes, packed_num_buffers); the
  gloo engine (`rlkit.servers.vllm.gloo_engine`) takes the same fields plus `group_name`, `timeout_s` and `relay`
  (the group is a chain: `wire.default_relay`), which the NCCL engine would refuse, so they are only sent for gloo.
  One group holds every server of a push (rlkit.weights.xccl): each server's workers join with their own
  `rank_offset`.
- `POST /start_weight_update` (no body): the workers set up vLLM's layerwise reload.
- `POST /update_weights {"update_info": {"names", "dtype_names", "shapes"}}`: the workers receive those tensors, in
  that order, from group rank 0 and load them. Packed mode (set at the join) cuts them into flat byte chunks by
  `rlkit.servers.vllm.wire.packed_chunks` (vLLM's `packed_nccl_broadcast_consumer` rule; the trainer cuts alike).
- `POST /finish_weight_update {"weight_version": "N"}`: finalize the reload (rlkit's gloo engine also repairs tied
  layers here) and set the version, confirmed by `GET /weight_info`.

Pause/resume and the prefix-cache reset are the caller's (the weight transport's) business.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlkit.errors import StepError
from rlkit.servers.http import ServerUnreachable, answer_object, call
from rlkit.servers.vllm.wire import PACKED_BUFFER_BYTES, PACKED_NUM_BUFFERS, default_packed, default_relay

if TYPE_CHECKING:
    import httpx

    from rlkit.servers.backend import Server, TensorMeta, WeightGroup
    from rlkit.servers.weight_delta import DeltaHeader


def init_info(group: WeightGroup, packed: bool | None = None) -> dict[str, Any]:
    """The `init_info` of `/init_weight_transfer_engine` for `group` (see the module docstring); `packed` defaults to
    `wire.default_packed(group.backend)`, as the trainer's `XcclSender` does (both sides must agree)."""
    info: dict[str, Any] = {
        "master_address": group.master_address,
        "master_port": group.master_port,
        "rank_offset": group.rank_offset,
        "world_size": group.world_size,
        "packed": default_packed(group.backend) if packed is None else packed,
        "packed_buffer_size_bytes": PACKED_BUFFER_BYTES,
        "packed_num_buffers": PACKED_NUM_BUFFERS,
    }
    if group.backend == "gloo":
        info.update(group_name=group.group_name, timeout_s=group.timeout_s, relay=default_relay(group.backend))
    return info


def update_info(tensors: Sequence[TensorMeta], push: str | None = None, delta: DeltaHeader | None = None
                ) -> dict[str, Any]:
    """The `update_info` of `/update_weights`; `push` (rlkit's gloo engine only) names the push the bucket is of,
    `delta` (gloo engine only) is the header of a push in a run with deltas (rlkit.servers.weight_delta)."""
    info: dict[str, Any] = {"names": [t.name for t in tensors], "dtype_names": [t.dtype for t in tensors],
                            "shapes": [list(t.shape) for t in tensors]}
    if push is not None:
        info["push"] = push
    if delta is not None:
        info["delta"] = delta.as_json()
    return info


def _hint(exc: StepError, server: Server) -> StepError:
    if isinstance(exc, ServerUnreachable):
        return exc
    return StepError(f"{exc}\n  fix: {server.label} must run with VLLM_SERVER_DEV_MODE=1 and "
                     "--weight-transfer-config '{\"backend\": \"gloo\"}' (CPU) or '{\"backend\": \"nccl\"}' (GPUs)")


async def join_group(client: httpx.AsyncClient, server: Server, group: WeightGroup, timeout: float, *,
                     packed: bool | None = None) -> None:
    """The server's workers join `group`; returns once they did (the trainer joins concurrently). `packed`: see
    `init_info` (bench/bench_xccl.py compares both modes; a weight sync keeps the default)."""
    try:
        await call(client, server, "POST", "/init_weight_transfer_engine",
                   f"joining weight group {group.group_name} at {group.master_address}:{group.master_port}", timeout,
                   json={"init_info": init_info(group, packed)})
    except StepError as exc:
        raise _hint(exc, server) from exc


async def begin(client: httpx.AsyncClient, server: Server, timeout: float) -> None:
    """Start a weight update (vLLM sets up its layerwise reload).

    A trainer that died mid-push leaves the workers' update open, and vLLM refuses a second start; then the stale
    update is finished (its half-loaded layers are about to be overwritten by this full push) and started again.
    """
    what = "the start of a weight update"
    try:
        await call(client, server, "POST", "/start_weight_update", what, timeout)
    except ServerUnreachable:
        raise
    except StepError as first:
        try:
            await call(client, server, "POST", "/finish_weight_update", "closing a stale weight update",
                       timeout, json={})
            await call(client, server, "POST", "/start_weight_update", what, timeout)
        except StepError:
            raise _hint(first, server) from first


async def receive_bucket(client: httpx.AsyncClient, server: Server, tensors: list[TensorMeta], timeout: float, *,
                         push: str | None = None, delta: DeltaHeader | None = None) -> None:
    """The workers receive `tensors` (sent by group rank 0 meanwhile, in this order) and load them; `push`,
    `delta`: see `update_info`."""
    size = sum(_nbytes(t) for t in tensors) / 1e6
    await call(client, server, "POST", "/update_weights",
               f"receiving a bucket of {len(tensors)} tensors ({size:.1f} MB)", timeout,
               json={"update_info": update_info(tensors, push, delta)})


async def finish(client: httpx.AsyncClient, server: Server, version: int, timeout: float) -> None:
    """Finalize the update, set the version to `version` and check that the server reports it."""
    await call(client, server, "POST", "/finish_weight_update", f"finishing weight version {version}", timeout,
               json={"weight_version": str(version)})
    response = await call(client, server, "GET", "/weight_info", "the weight version", timeout)
    reported = answer_object(response, server, "the weight version").get("weight_version")
    if reported != str(version):
        raise StepError(f"{server.label}: reports weight version {reported!r} after finishing version {version}")


_ITEMSIZE = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8, "int64": 8, "int32": 4,
             "int8": 1, "uint8": 1, "bool": 1}


def _nbytes(meta: TensorMeta) -> int:
    count = 1
    for dim in meta.shape:
        count *= dim
    return count * _ITEMSIZE.get(meta.dtype, 4)
