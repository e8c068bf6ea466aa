"""Recover checkpoints on disk: sealing, verification, choosing the newest valid one, pruning, data positions."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rlkit.train import recover


def _fake_checkpoint(root: Path, step: int, payload: bytes = b"x" * 1000) -> Path:
    tmp = recover.temp_dir(root, step)
    (tmp / recover.SHARDS).mkdir(parents=True)
    (tmp / recover.SHARDS / "__0_0.distcp").write_bytes(payload)
    (tmp / recover.SHARDS / ".metadata").write_bytes(b"meta")
    (tmp / recover.STATE).write_text(recover.TrainerState(step=step, version=step).to_json())
    final = recover.checkpoint_dir(root, step)
    recover.seal(tmp, final)
    return final


def test_seal_writes_a_manifest_of_every_file_and_renames(tmp_path: Path) -> None:
    final = _fake_checkpoint(tmp_path, 7)
    assert final.name == "step-00000007" and not recover.temp_dir(tmp_path, 7).exists()
    manifest = json.loads((final / recover.MANIFEST).read_text())
    paths = sorted(e["path"] for e in manifest["files"])
    assert paths == [f"{recover.SHARDS}/.metadata", f"{recover.SHARDS}/__0_0.distcp", recover.STATE]
    sizes = {e["path"]: e["size"] for e in manifest["files"]}
    assert sizes[f"{recover.SHARDS}/__0_0.distcp"] == 1000
    assert recover.verify(final) is None


@pytest.mark.parametrize("damage", ["truncate", "delete", "flip", "no-manifest"])
def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning(tmp_path: Path, damage: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    _fake_checkpoint(tmp_path, 4)
    newest = _fake_checkpoint(tmp_path, 8)
    shard = newest / recover.SHARDS / "__0_0.distcp"
    if damage == "truncate":
        shard.write_bytes(b"x" * 500)
    elif damage == "delete":
        shard.unlink()
    elif damage == "flip":
        shard.write_bytes(b"y" + b"x" * 999)  # same size, other bytes: only the checksum sees it
    else:
        (newest / recover.MANIFEST).unlink()
    assert recover.verify(newest) is not None
    with caplog.at_level(logging.WARNING):
        found = recover.latest_valid(tmp_path)
    assert found is not None and found[0] == 4
    assert "step-00000008 is damaged" in caplog.text


def test_nothing_valid_means_none(tmp_path: Path) -> None:
    assert recover.latest_valid(tmp_path / "missing") is None
    newest = _fake_checkpoint(tmp_path, 3)
    (newest / recover.STATE).unlink()
    assert recover.latest_valid(tmp_path, warn=False) is None


def test_prune_keeps_the_newest_valid_and_drops_damaged_and_temp(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        _fake_checkpoint(tmp_path, step)
    (recover.checkpoint_dir(tmp_path, 8) / recover.MANIFEST).unlink()  # damaged: pruned, not counted
    recover.temp_dir(tmp_path, 9).mkdir()  # a write that crashed
    recover.prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000006"]


def test_positions_round_trip() -> None:
    done = {0, 1, 2, 3, 7, 9}
    prefix, extra = recover.compress_positions(done)
    assert (prefix, extra) == (4, [7, 9])
    assert recover.expand_positions(prefix, extra) == done
    assert recover.compress_positions(set()) == (0, [])


def test_trainer_state_and_rng_round_trip() -> None:
    import random

    import torch

    state = recover.TrainerState(step=5, version=5, consumed_prefix=20, consumed_extra=[22], optimizer_steps=10,
                                 rng=recover.rng_state())
    expected = (random.random(), float(torch.rand(1)))
    again = recover.TrainerState.from_json(state.to_json())
    recover.set_rng_state(again.rng)
    assert (random.random(), float(torch.rand(1))) == expected
    assert again.consumed_extra == [22] and again.optimizer_steps == 10
