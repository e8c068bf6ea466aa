"""Recover checkpoints through the engine (save_sharded / load_sharded) on real gloo ranks with a tiny tied-head
model: a round trip restores model and AdamW state bit for bit and the next step is the straight run's; a damaged
rank file is refused on every rank; another world size gathers the rows it needs; a torch.distributed.checkpoint of
older rlkit versions still loads."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from rlkit.errors import StepError
from rlkit.trainer import rank_files
from rlkit.trainer.rank_files import DamagedCheckpoint, Piece, rank_file_name, write_rank_file
from rlkit.trainer.rank_gather import gather_rows
from rlkit.trials.recover_layout import FileDigest
from tests.helpers.gloo_ranks import run_ranks

WORKER = r'''
import json, shutil, sys
from pathlib import Path
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from rlkit.config.schema.actor import ActorConfig
from rlkit.trainer.dist import init_distributed
from rlkit.trainer.engine import TrainEngine
from rlkit.trainer import rank_gather
from rlkit.trainer.rank_files import DamagedCheckpoint
from rlkit.trials.recover_layout import FileDigest

gathered = []  # loads that took the rows path, not the one-read path of a rank's own file
gather_rows = rank_gather.gather_rows
rank_gather.gather_rows = lambda *args: gathered.append(1) or gather_rows(*args)

model_dir, out, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
env, device = init_distributed()
config = ActorConfig(path=model_dir, dtype="float32", gradient_checkpointing=False, attn_impl="sdpa")
config.optimizer.lr = 1e-2

def build():
    return TrainEngine(config, rank=env.rank, world=env.world_size, device=device, total_optimizer_steps=10)

def loss_fn(model, ids):
    return model(input_ids=ids, use_cache=False).logits.float().pow(2).mean(), 1

def step(engine):
    engine.optimizer_step([torch.tensor([[5, 6, 7, 8, 9]]) + env.rank], loss_fn, 1.0)

def full_state(engine):
    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)
    state = {f"model/{k}": v for k, v in model_sd.items()}
    state.update({f"optim/{p}/{k}": v for p, entry in optim_sd["state"].items() for k, v in entry.items()})
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone() for k, v in state.items()}
    groups = [{k: v for k, v in g.items()} for g in optim_sd["param_groups"]]
    return full, groups

def same(a, b):
    return a[1] == b[1] and set(a[0]) == set(b[0]) and all(torch.equal(a[0][k], b[0][k]) for k in a[0])

def damaged(engine, path, digests):
    try:
        engine.load_sharded(path, 2, digests)
    except DamagedCheckpoint as exc:
        return str(exc)
    return None

result = {}
if mode == "save":
    engine = build()
    step(engine), step(engine)
    digests = engine.save_sharded(out / "ckpt")
    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(out / "old"))  # the former format
    saved = full_state(engine)
    step(engine)
    straight = full_state(engine)
    resumed = build()
    resumed.load_sharded(out / "ckpt", 2, digests)
    result["round_trip"] = same(full_state(resumed), saved)
    result["optimizer_steps"] = resumed.optimizer_steps
    step(resumed)
    result["next_step"] = same(full_state(resumed), straight)
    old = build()
    old.load_sharded(out / "old", 2)
    result["old_format"] = same(full_state(old), saved)
    if env.rank == 0:
        torch.save(saved, out / "saved.pt")
        json.dump(digests, open(out / "digests.json", "w"))
        bad = out / "bad"
        shutil.copytree(out / "ckpt", bad)
        victim = sorted(bad.iterdir())[-1]  # the last rank's file, same size, one byte other
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
    torch.distributed.barrier()
    bad_digests = {str(out / "bad" / Path(k).name): v for k, v in digests.items()}
    result["damaged"] = damaged(build(), out / "bad", bad_digests)
else:  # another world than the one that saved
    digests = {k: FileDigest(*v) for k, v in json.load(open(out / "digests.json")).items()}
    saved = torch.load(out / "saved.pt")
    engine = build()
    engine.load_sharded(out / "ckpt", 2, digests)
    result["resharded"] = same(full_state(engine), saved)
    bad_digests = {str(out / "bad" / Path(k).name): v for k, v in digests.items()}
    result["damaged"] = damaged(build(), out / "bad", bad_digests)
    old = build()
    old.load_sharded(out / "old", 2)
    result["old_format"] = same(full_state(old), saved)
result["gathered"] = len(gathered)
json.dump(result, open(out / f"{mode}-{env.rank}.json", "w"))
torch.distributed.destroy_process_group()
'''


def _results(out: Path, mode: str, world: int) -> list[dict[str, object]]:
    return [json.loads((out / f"{mode}-{rank}.json").read_text()) for rank in range(world)]


def test_recover_checkpoint_round_trip_damage_reshard_and_old_format(tied_model_dir: Path, tmp_path: Path) -> None:
    """Saved by 2 ranks, loaded by 2 (one read of each rank's file) then by 1 (the rows gathered): other worlds'
    gathers are tested in this process below (a run of gloo ranks costs ~50 CPU-s here)."""
    saving, loading = 2, 1
    run_ranks(saving, ["-c", WORKER, str(tied_model_dir), str(tmp_path), "save"])
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == [f"rank-{rank:05d}-of-{saving:05d}.safetensors" for rank in range(saving)]
    for result in _results(tmp_path, "save", saving):
        assert result["round_trip"] is True, "model + AdamW state must come back bit for bit"
        assert result["optimizer_steps"] == 2
        assert result["next_step"] is True, "the resumed run's next step must be the straight run's"
        assert result["old_format"] is True, "a torch.distributed.checkpoint of older rlkit must still load"
        damage = str(result["damaged"])
        assert result["gathered"] == 0, "the same world reads each rank's own file in one pass"
        assert f"rank {saving - 1}: rank-{saving - 1:05d}-of-{saving:05d}.safetensors does not match" in damage
    run_ranks(loading, ["-c", WORKER, str(tied_model_dir), str(tmp_path), "reshard"])
    for result in _results(tmp_path, "reshard", loading):
        assert result["resharded"] is True, f"a checkpoint of {saving} ranks must load on {loading} bit for bit"
        assert "does not match its xxh3_128_of_2mib_blocks checksum" in str(result["damaged"])
        assert result["old_format"] is True
        assert result["gathered"] == 2
    with safe_open(str(tmp_path / "ckpt" / files[0]), "pt") as f:
        aliases = json.loads(f.metadata()["rlkit"])["aliases"]
    assert aliases == {"model/lm_head.weight": "model/model.embed_tokens.weight"}  # the tied head written once


class _Shard(Piece):
    """A dim-0 shard without a device mesh: rows `first`.. of the whole tensor (what FSDP2 gives each rank)."""

    def __init__(self, name: str, whole: torch.Tensor, first: int, rows: int) -> None:
        super().__init__(name, whole[first:first + rows].clone(), list(whole.shape), "Shard(dim=0)", whole)
        self.first = first

    def global_offset(self) -> list[int]:
        return [self.first] + [0] * (self.whole.dim() - 1)


def _write_world(directory: Path, tensors: dict[str, torch.Tensor], world: int) -> dict[str, FileDigest]:
    """Rank files of `world` ranks, each holding its even (FSDP2-style, last rank shorter) rows of every tensor."""
    digests = {}
    for rank in range(world):
        pieces: list[Piece] = []
        for name, whole in tensors.items():
            if not whole.dim():  # a scalar (AdamW's step) is whole on every rank
                pieces.append(Piece(name, whole.clone(), [], "", whole))
                continue
            per = -(-whole.shape[0] // world)
            first = min(rank * per, whole.shape[0])
            pieces.append(_Shard(name, whole, first, min(per, whole.shape[0] - first)))
        path = directory / rank_file_name(rank, world)
        digests[str(path)] = write_rank_file(path, pieces, {"param_groups": []}, rank=rank, world=world)
    return digests


@pytest.mark.parametrize(("saved", "loaded"), [(1, 2), (2, 3), (3, 2), (4, 1)])
def test_rows_are_gathered_for_any_other_world(tmp_path: Path, saved: int, loaded: int) -> None:
    """The gather path of a load on another world, in this process (the gloo test above takes 2 ranks then 1): each
    loading rank's rows come from whichever saved files hold them, split anywhere, bit for bit."""
    generator = torch.Generator().manual_seed(saved * 10 + loaded)
    tensors = {"model/w": torch.randn(7, 3, generator=generator),
               "optim/w/exp_avg": torch.randn(7, 3, generator=generator).to(torch.bfloat16),
               "optim/w/step": torch.tensor(5.0)}
    digests = _write_world(tmp_path, tensors, saved)
    for rank in range(loaded):
        per = -(-7 // loaded)
        first = min(rank * per, 7)
        targets = {name: _Shard(name, torch.zeros_like(whole), first, min(per, 7 - first)) if whole.dim()
                   else Piece(name, torch.zeros_like(whole), [], "", torch.zeros_like(whole))
                   for name, whole in tensors.items()}
        gather_rows(tmp_path, targets, digests)
        for name, whole in tensors.items():
            expected = whole[first:first + targets[name].local.shape[0]] if whole.dim() else whole
            assert torch.equal(targets[name].local, expected), (name, rank)


def test_a_damaged_header_found_while_gathering_is_a_damaged_checkpoint(tmp_path: Path) -> None:
    """The rows' plan reads every file's header before any file is checked whole: a header damaged into another dtype
    must still make the load fall back to the previous checkpoint (DamagedCheckpoint), not stop it (StepError)."""
    tensors = {"model/w": torch.randn(7, 3), "optim/w/step": torch.tensor(5.0)}
    digests = _write_world(tmp_path, tensors, 2)
    victim = tmp_path / rank_file_name(1, 2)
    data = victim.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    header["model/w"]["dtype"] = "F16"
    raw = json.dumps(header).encode()
    victim.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + length:])
    targets = {"model/w": _Shard("model/w", torch.zeros(7, 3), 0, 7),
               "optim/w/step": Piece("optim/w/step", torch.zeros(()), [], "", torch.zeros(()))}
    with pytest.raises(DamagedCheckpoint, match=r"rank-00001-of-00002\.safetensors does not match"):
        gather_rows(tmp_path, targets, digests)
    with pytest.raises(StepError, match="is F16"):  # checked already (no digests): the mismatch itself
        gather_rows(tmp_path, targets, None)


def test_a_checksum_that_fails_fails_the_write_instead_of_waiting_forever(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The checksum runs on a thread of its own: its failure must reach the writer, whose wait for the digest would
    otherwise never end (and the other ranks then wait in their next collective until its timeout)."""

    class Failing:
        def update(self, data: object) -> None:
            raise MemoryError("no room to hash")

    monkeypatch.setattr(rank_files.xxhash, "xxh3_128", Failing)
    tensor = torch.randn(4, 3)
    outcome: dict[str, Any] = {}

    def write() -> None:
        try:
            write_rank_file(tmp_path / "rank.safetensors", [Piece("model/w", tensor, [4, 3], "", tensor)], {},
                            rank=0, world=1)
        except Exception as exc:
            outcome["error"] = exc

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(5.0)
    assert not writer.is_alive(), "the write waited for a checksum whose thread had failed"
    assert isinstance(outcome.get("error"), RuntimeError), outcome
    assert "checksumming the rank file failed: MemoryError: no room to hash" in str(outcome["error"])
