"""The broadcast wire format rlkit's trainer side and its gloo engine share, checked against vLLM's own NCCL code
(pure functions: no server, no group; an integration test only because importing vLLM takes seconds)."""

from __future__ import annotations

import pytest

from rlkit.servers.backend import WeightGroup
from rlkit.servers.vllm.broadcast import init_info, update_info
from rlkit.servers.vllm.wire import packed_chunks


@pytest.mark.filterwarnings("ignore:Tensor 't:UserWarning")  # vLLM warns of a tensor larger than the buffer
@pytest.mark.parametrize("buffer_bytes", [1, 250, 300, 700, 10**6])
def test_chunks_are_cut_where_vllms_packer_cuts_them(buffer_bytes: int) -> None:
    import torch
    from vllm.distributed.weight_transfer.packed_tensor import pack_tensors

    sizes = [100, 100, 100, 400, 4, 200, 96]
    tensors = [(f"t{i}", torch.zeros(size, dtype=torch.uint8)) for i, size in enumerate(sizes)]
    iterator = iter(tensors)
    vllm_chunks = []
    while (chunk := pack_tensors(iterator, lambda item: item[1], buffer_bytes)) is not None:
        vllm_chunks.append([int(name[1:]) for name in chunk.names])
    assert [list(chunk) for chunk in packed_chunks(sizes, buffer_bytes)] == vllm_chunks


def test_no_tensors_no_chunks() -> None:
    assert packed_chunks([], 100) == []


def test_init_info_is_what_vllms_nccl_engine_accepts_and_gloo_adds_its_fields() -> None:
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo

    from rlkit.servers.vllm.gloo_engine import GlooWeightTransferInitInfo

    group = WeightGroup(master_address="node1", master_port=29500, rank_offset=1, world_size=3,
                        group_name="rlkit-weights-s0-g1", backend="nccl", timeout_s=60.0)
    nccl = init_info(group)
    assert NCCLWeightTransferInitInfo(**nccl).packed is True  # accepted as is by vLLM's own engine; packed on GPUs
    gloo = init_info(WeightGroup(**{**group.__dict__, "backend": "gloo"}))
    assert set(gloo) - set(nccl) == {"group_name", "timeout_s", "relay"}
    parsed = GlooWeightTransferInitInfo(**gloo)
    assert (parsed.group_name, parsed.timeout_s, parsed.packed, parsed.relay) == ("rlkit-weights-s0-g1", 60.0, False,
                                                                                   True)
    assert GlooWeightTransferInitInfo(**init_info(group, packed=True)).packed is True
    with pytest.raises(TypeError):
        NCCLWeightTransferInitInfo(**gloo)  # why the gloo fields are only sent to gloo


def test_update_info_is_what_vllms_nccl_engine_accepts() -> None:
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    from rlkit.servers.backend import TensorMeta

    info = update_info([TensorMeta("a.weight", "bfloat16", (4, 2)), TensorMeta("a.bias", "float32", (4,))])
    assert NCCLWeightTransferUpdateInfo(**info).shapes == [[4, 2], [4]]
