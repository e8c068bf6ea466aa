"""Delta pushes without servers: the wire format (rlkit.servers.weight_delta), the receiver's copy, the trainer's
choice of full or delta (rlkit.weights.delta) and the disk file, with real tensors and real safetensors files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlkit.servers.backend import Server
from rlkit.servers.weight_delta import INDEX, VALUES, DeltaBase, DeltaHeader, encode, read_push
from rlkit.weights.base import ServerOutcome, ServerSync
from rlkit.weights.delta import DeltaEncoder, write_delta


def sparse_step(tensor: torch.Tensor, fraction: float, seed: int) -> torch.Tensor:
    """`tensor` with `fraction` of its elements moved (the rest bit-for-bit the same)."""
    generator = torch.Generator().manual_seed(seed)
    out = tensor.clone()
    flat = out.reshape(-1)
    picked = torch.randperm(flat.numel(), generator=generator)[: max(1, int(flat.numel() * fraction))]
    flat[picked] += torch.randn(picked.numel(), generator=generator).to(flat.dtype)
    return out


def apply_all(base: DeltaBase, header: DeltaHeader, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    base.begin(header)
    complete = dict(base.take(tensors.items()))
    base.commit()
    return complete


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_sparse_change_travels_as_indices_and_values_and_rebuilds_the_tensor_bit_for_bit(dtype: torch.dtype
                                                                                             ) -> None:
    old = torch.randn(64, 48).to(dtype)
    new = sparse_step(old, 0.02, seed=1)
    wire = encode("w", new, old)
    assert set(wire) == {"w" + INDEX, "w" + VALUES}
    assert wire["w" + INDEX].dtype == torch.int32 and wire["w" + VALUES].dtype == dtype
    assert sum(t.nbytes for t in wire.values()) < new.nbytes / 8
    base = DeltaBase()
    apply_all(base, DeltaHeader("p1"), {"w": old.clone()})
    rebuilt = apply_all(base, DeltaHeader("p2", base="p1"), wire)["w"]
    assert torch.equal(rebuilt.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       new.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    assert base.id == "p2"


def test_a_dense_change_travels_whole_at_the_break_even() -> None:
    old = torch.randn(1000).to(torch.bfloat16)
    assert set(encode("w", sparse_step(old, 0.30, seed=2), old)) == {"w" + INDEX, "w" + VALUES}  # 6 B x 30% < 2 B
    assert set(encode("w", sparse_step(old, 0.40, seed=2), old)) == {"w"}  # 6 B x 40% > 2 B: whole
    assert set(encode("w", old, None)) == {"w"}  # nothing to compare with
    assert set(encode("w", old[:10], old)) == {"w"}  # another shape


def test_changes_are_seen_bit_for_bit_and_an_unchanged_tensor_still_sends_one_element() -> None:
    old = torch.tensor([0.0, 1.0, float("nan"), 2.0, 3.0, 4.0, 5.0, 6.0])
    new = old.clone()
    new[0] = -0.0  # equal as numbers, not as bits
    wire = encode("w", new, old)
    assert wire["w" + INDEX].tolist() == [0]  # NaN == NaN bitwise: not a change
    unchanged = encode("w", old.clone(), old)
    assert unchanged["w" + INDEX].numel() == 1 and unchanged["w" + VALUES].numel() == 1


def test_a_delta_against_another_push_is_refused_naming_both_and_a_half_push_leaves_no_base() -> None:
    base = DeltaBase()
    with pytest.raises(ValueError, match=r"applies to push p1, but this server holds no complete push"):
        base.begin(DeltaHeader("p2", base="p1"))
    old = torch.randn(100)
    apply_all(base, DeltaHeader("p1"), {"w": old.clone(), "v": old.clone()})
    with pytest.raises(ValueError, match=r"applies to push p0, but this server holds p1"):
        base.begin(DeltaHeader("p2", base="p0"))
    wire = encode("w", sparse_step(old, 0.01, seed=3), old)
    base.begin(DeltaHeader("p2", base="p1"))
    base.take([("w" + VALUES, wire["w" + VALUES])])  # the index never comes (the push broke)
    base.commit()
    assert base.id is None  # so the next delta is refused and the trainer must send a full push
    with pytest.raises(ValueError, match="holds no complete push"):
        base.begin(DeltaHeader("p3", base="p2"))


def test_a_bucket_applied_twice_gives_the_same_tensor() -> None:
    old = torch.randn(200)
    new = sparse_step(old, 0.05, seed=4)
    wire = encode("w", new, old)
    base = DeltaBase()
    apply_all(base, DeltaHeader("p1"), {"w": old.clone()})
    base.begin(DeltaHeader("p2", base="p1"))
    base.take(reversed(wire.items()))  # values before the index: as a safetensors file may list them
    again = dict(base.take(wire.items()))  # a bucket sent again after a failure
    base.commit()
    assert torch.equal(again["w"], new) and base.id == "p2"


def servers(*addresses: str) -> list[Server]:
    return [Server(index=i, address=a, model="m", backend="vllm") for i, a in enumerate(addresses)]


def synced(targets: list[Server], failed: frozenset[int] = frozenset()) -> list[ServerOutcome]:
    return [ServerOutcome(s, failure="x") if s.index in failed else
            ServerOutcome(s, sync=ServerSync(index=s.index, address=s.address, version=1)) for s in targets]


def push(encoder: DeltaEncoder, targets: list[Server], state: dict[str, torch.Tensor], *, finish: bool = True
         ) -> tuple[DeltaHeader, dict[str, torch.Tensor]]:
    header = encoder.header(targets)
    wire = encoder.encode_bucket(state)
    if finish:
        encoder.complete()
    return header, wire


def test_the_trainer_sends_a_delta_only_to_servers_that_hold_its_last_push() -> None:
    encoder = DeltaEncoder(torch.bfloat16, skip=["lm_head.weight"])
    weights = torch.randn(300)
    state = {"w": weights, "lm_head.weight": weights}
    two = servers("a:1", "b:1")

    first, wire = push(encoder, two, state)
    assert first.base is None and set(wire) == {"w"}  # full; the tied alias is never sent
    assert wire["w"].dtype == torch.bfloat16
    encoder.settle(synced(two))
    state["w"] = sparse_step(weights, 0.01, seed=5)
    second, wire = push(encoder, two, state)
    assert second.base == first.id and set(wire) == {"w" + INDEX, "w" + VALUES}
    encoder.settle(synced(two, failed=frozenset({1})))  # b failed this push
    third, _ = push(encoder, two, state)
    assert third.base is None  # b does not hold the last push: full for all (one file, one group)
    encoder.settle(synced(two))
    restarted = servers("a:1", "b:2")  # b came back under a new address
    fourth, _ = push(encoder, restarted, state)
    assert fourth.base is None
    encoder.settle(synced(restarted))
    half, _ = push(encoder, restarted, state, finish=False)  # the push broke while encoding
    assert half.base == fourth.id
    encoder.settle(synced(restarted))
    assert push(encoder, restarted, state)[0].base is None


def test_the_encoder_keeps_a_copy_when_handed_the_trainers_own_storage() -> None:
    encoder = DeltaEncoder(None)
    param = torch.zeros(100)
    target = servers("a:1")
    push(encoder, target, {"w": param})
    encoder.settle(synced(target))
    param[7] = 1.0  # the optimizer steps in place
    _, wire = push(encoder, target, {"w": param})
    assert wire["w" + INDEX].tolist() == [7] and wire["w" + VALUES].tolist() == [1.0]


def test_a_delta_file_is_read_back_only_as_the_push_it_names(tmp_path: Path) -> None:
    old = torch.randn(50).to(torch.bfloat16)
    wire = encode("w", sparse_step(old, 0.05, seed=6), old)
    header = DeltaHeader("p2", base="p1")
    out = write_delta(wire, tmp_path / "version-2", header)
    assert sorted(p.name for p in out.iterdir()) == ["rlkit-delta.safetensors"]
    assert oct(out.stat().st_mode & 0o777) == "0o755"
    read = dict(read_push(out, header))
    assert all(torch.equal(read[k], v) for k, v in wire.items())
    with pytest.raises(ValueError, match="is push 'p2', not the announced p3"):
        read_push(out, DeltaHeader("p3", base="p1"))
    with pytest.raises(FileExistsError):
        write_delta(wire, out, header)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["version-2"]  # no temporary directory left


def test_a_header_from_json_names_what_is_wrong() -> None:
    assert DeltaHeader.from_json({"id": "p2", "base": "p1"}) == DeltaHeader("p2", "p1")
    assert DeltaHeader.from_json(DeltaHeader("p1").as_json()) == DeltaHeader("p1")
    for bad in ({"base": "p1"}, {"id": ""}, {"id": "p", "base": 3}, "p1"):
        with pytest.raises(ValueError, match="delta header"):
            DeltaHeader.from_json(bad)


def test_a_broadcast_with_deltas_is_refused_where_an_engine_takes_whole_tensors_only(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import asyncio

    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.errors import StepError
    from rlkit.servers.backend import TensorMeta, WeightGroup, backend_for
    from rlkit.trials.paths import TrialPaths
    from rlkit.weights import xccl_transport

    config = ExperimentConfig()
    config.actor.weight_update_mode, config.actor.weight_update_delta = "xccl", True
    transport = xccl_transport.XcclTransport(config, TrialPaths(tmp_path / "trial"))
    transport.start()  # gloo here: accepted
    monkeypatch.setattr(xccl_transport, "group_backend", lambda: "nccl")
    with pytest.raises(StepError, match=r"(?s)NCCL engine.*whole tensors only.*fix: set actor.weight_update_mode"):
        transport.start()  # a trainer with CUDA: refused before any push

    group = WeightGroup(master_address="h", master_port=1, rank_offset=1, world_size=2, group_name="g",
                        backend="nccl", timeout_s=5.0)
    server = Server(index=2, address="h:1", model="m", backend="vllm")
    meta = [TensorMeta("w", "float32", (2,))]
    for backend, says in (("vllm", "needs rlkit's gloo engine"), ("sglang", "SGLang takes whole weights only")):
        call = backend_for(backend).receive_weight_bucket(None, server, group, meta, 5.0,  # type: ignore[arg-type]
                                                          delta=DeltaHeader("p2", "p1"))
        with pytest.raises(StepError, match=rf"(?s)server 2 .*{says}"):
            asyncio.run(call)
