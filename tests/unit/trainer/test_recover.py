"""Recover checkpoints on disk: sealing, verification, choosing the newest valid one, pruning, data positions."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rlkit.trainer import recover


def _fake_checkpoint(root: Path, step: int, payload: bytes = b"x" * 1000) -> Path:
    tmp = recover.temp_dir(root, step)
    (tmp / recover.SHARDS).mkdir(parents=True)
    (tmp / recover.SHARDS / "__0_0.distcp").write_bytes(payload)
    (tmp / recover.SHARDS / ".metadata").write_bytes(b"meta")
    (tmp / recover.STATE).write_text(recover.LoopState(step=step, engines={"actor": step}).to_json())
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

    state = recover.LoopState(step=5, engines={"actor": 10, "critic": 5},
                              algorithm={"version": 5, "consumed_extra": [22]}, rng=recover.rng_state())
    expected = (random.random(), float(torch.rand(1)))
    again = recover.LoopState.from_json(state.to_json())
    recover.set_rng_state(again.rng)
    assert (random.random(), float(torch.rand(1))) == expected
    assert again.engines == {"actor": 10, "critic": 5} and again.algorithm["consumed_extra"] == [22]


def test_a_same_step_checkpoint_is_replaced_only_once_the_new_one_is_sealed(tmp_path: Path) -> None:
    old = _fake_checkpoint(tmp_path, 6, payload=b"a" * 1000)
    new = _fake_checkpoint(tmp_path, 6, payload=b"b" * 1000)
    assert new == old and (new / recover.SHARDS / "__0_0.distcp").read_bytes() == b"b" * 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000006"]  # no temp, no aside left
    assert recover.verify(new) is None


def test_a_crash_between_rename_aside_and_rename_in_keeps_the_old_checkpoint(tmp_path: Path) -> None:
    """The state a crash inside replace_dir leaves: the old checkpoint renamed aside, the new one still a temp dir.
    The aside one is found (and verified) as the checkpoint of its step; the next save of the step replaces it."""
    old = _fake_checkpoint(tmp_path, 6, payload=b"a" * 1000)
    aside = tmp_path / ".step-00000006.old"
    old.rename(aside)
    found = recover.latest_valid(tmp_path)
    assert found == (6, aside)
    recover.prune(tmp_path, keep_last=1)
    assert aside.is_dir(), "prune must keep the only copy of step 6"
    new = _fake_checkpoint(tmp_path, 6, payload=b"b" * 1000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000006"]
    assert recover.latest_valid(tmp_path) == (6, new)


def test_manifest_holds_xxh3_and_the_cheap_check_reads_no_data(tmp_path: Path) -> None:
    import xxhash

    final = _fake_checkpoint(tmp_path, 2)
    entries = json.loads((final / recover.MANIFEST).read_text())["files"]
    shard = next(e for e in entries if e["path"].endswith("__0_0.distcp"))
    assert shard[recover.CHECKSUM] == xxhash.xxh3_128(b"x" * 1000).hexdigest() and "sha256" not in shard
    (final / recover.SHARDS / "__0_0.distcp").write_bytes(b"y" * 1000)  # same size, other bytes
    assert recover.verify(final, checksums=False) is None  # the login node's check: manifest and sizes
    assert recover.latest_valid(tmp_path, warn=False, checksums=False) == (2, final)
    assert "does not match its xxh3_128 checksum" in str(recover.verify(final))  # the trainer's check, at load


def test_a_manifest_of_an_older_rlkit_with_sha256_still_loads(tmp_path: Path) -> None:
    import hashlib

    final = _fake_checkpoint(tmp_path, 3)
    manifest = json.loads((final / recover.MANIFEST).read_text())
    for entry in manifest["files"]:
        del entry[recover.CHECKSUM]
        entry["sha256"] = hashlib.sha256((final / entry["path"]).read_bytes()).hexdigest()
    (final / recover.MANIFEST).write_text(json.dumps(manifest))
    assert recover.verify(final) is None
    (final / recover.SHARDS / "__0_0.distcp").write_bytes(b"y" * 1000)  # same size, other bytes
    assert "does not match its sha256 checksum" in str(recover.verify(final))


@pytest.mark.parametrize("manifest", [
    '{"files": "nope"}', '{"files": [{"path": "x"}]}', '[1, 2]',
    '{"files": [{"path": "../../etc/passwd", "size": 1, "xxh3_128": "0"}]}',
    '{"files": [{"path": "trainer_state.json", "size": 1, "md5": "0"}]}',
])
def test_a_malformed_manifest_is_a_damaged_checkpoint_not_a_crash(tmp_path: Path, manifest: str) -> None:
    final = _fake_checkpoint(tmp_path, 5)
    (final / recover.MANIFEST).write_text(manifest)
    assert recover.verify(final, checksums=False) is not None
    assert recover.latest_valid(tmp_path, warn=False) is None


def test_a_rank_file_is_checksummed_while_written_and_seal_uses_that_digest(tmp_path: Path) -> None:
    """A rank file (rlkit.trainer.rank_files) written for one rank: the digest recorded while writing is that of the
    file on disk (xxh3-128 over its 2 MiB blocks' xxh3-128 digests, computed here from the bytes), seal puts it into
    the manifest without hashing again, and the file is a safetensors file."""
    import torch
    import xxhash
    from safetensors import safe_open

    from rlkit.trainer import rank_files

    tmp = recover.temp_dir(tmp_path, 1)
    shards = recover.shards_dir(tmp, "actor")
    shards.mkdir(parents=True)
    tensors = {"model/w": torch.arange(1_300_000, dtype=torch.float32), "model/b": torch.ones(7, dtype=torch.bfloat16),
               "optim/w/step": torch.tensor(3.0)}
    shard = shards / rank_files.rank_file_name(0, 1)
    written = rank_files.write_rank_file(shard, rank_files.pieces_of(tensors), {"param_groups": [], "optim_values": {}},
                                         rank=0, world=1)
    data = shard.read_bytes()
    blocks = [xxhash.xxh3_128(data[at:at + (2 << 20)]).digest() for at in range(0, len(data), 2 << 20)]
    assert len(blocks) == 3
    assert written == (len(data), recover.BLOCK_CHECKSUM, xxhash.xxh3_128(b"".join(blocks)).hexdigest())
    assert recover.file_checksum(shard, recover.BLOCK_CHECKSUM) == written.digest
    with safe_open(str(shard), "pt") as f:
        assert set(f.keys()) == set(tensors) and torch.equal(f.get_tensor("model/w"), tensors["model/w"])
    (tmp / recover.STATE).write_text(recover.LoopState(step=1, engines={"actor": 1}).to_json())
    size = shard.stat().st_size
    lying = {str(shard): recover.FileDigest(size, recover.BLOCK_CHECKSUM, "0" * 32)}  # seal takes the recorded one
    final = recover.checkpoint_dir(tmp_path, 1)
    recover.seal(tmp, final, lying)
    relative = f"{recover.SHARDS}/actor/{shard.name}"
    entries = {e["path"]: e for e in json.loads((final / recover.MANIFEST).read_text())["files"]}
    assert entries[relative] == {"path": relative, "size": size, recover.BLOCK_CHECKSUM: "0" * 32}
    assert entries[recover.STATE][recover.CHECKSUM] == xxhash.xxh3_128((tmp.parent / final.name / recover.STATE)
                                                                       .read_bytes()).hexdigest()
    assert "does not match its xxh3_128_of_2mib_blocks" in str(recover.verify(final))  # the check before loading
    assert recover.verify(final, defer_rank_files=True) is None  # ... unless the rank file's loader checks it
    assert recover.manifest_digests(final)[str(final / relative)] == (size, recover.BLOCK_CHECKSUM, "0" * 32)


def test_rank_files_are_left_to_their_loader_for_checksums_but_not_for_sizes(tmp_path: Path) -> None:
    final = _fake_checkpoint(tmp_path, 2)
    rank_file = final / recover.SHARDS / "rank-00000-of-00001.safetensors"
    rank_file.write_bytes(b"r" * 100)
    manifest = json.loads((final / recover.MANIFEST).read_text())
    manifest["files"].append({"path": str(rank_file.relative_to(final)), "size": 100, recover.CHECKSUM: "0" * 32})
    (final / recover.MANIFEST).write_text(json.dumps(manifest))
    assert recover.verify(final, defer_rank_files=True) is None
    assert "rank-00000-of-00001.safetensors does not match" in str(recover.verify(final))
    rank_file.write_bytes(b"r" * 99)
    assert "has 99 bytes" in str(recover.verify(final, defer_rank_files=True))
    (final / recover.SHARDS / "__0_0.distcp").write_bytes(b"y" * 1000)  # not a rank file: checked before loading
    rank_file.write_bytes(b"r" * 100)
    assert "__0_0.distcp does not match" in str(recover.verify(final, defer_rank_files=True))


def test_latest_valid_below_a_step_skips_the_newer_ones(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        _fake_checkpoint(tmp_path, step)
    assert recover.latest_valid(tmp_path, below=6) == (4, recover.checkpoint_dir(tmp_path, 4))
    assert recover.latest_valid(tmp_path, below=2) is None


def test_an_empty_file_is_checksummed_too(tmp_path: Path) -> None:
    import hashlib

    import xxhash

    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert recover.file_checksum(empty) == xxhash.xxh3_128(b"").hexdigest()
    data = tmp_path / "data"
    data.write_bytes(b"abc" * 1000)
    assert recover.file_checksum(data, "sha256") == hashlib.sha256(b"abc" * 1000).hexdigest()


def test_a_checkpoint_without_an_engine_of_the_algorithm_is_refused_by_name(tmp_path: Path) -> None:
    from rlkit.errors import StepError

    state = recover.LoopState(step=3, engines={"actor": 3})
    recover.check_engines(state, ["actor"], tmp_path)  # the same engines: fine
    with pytest.raises(StepError, match=r"has no 'critic' engine \(it has: actor\); it was written by another job"):
        recover.check_engines(state, ["actor", "critic"], tmp_path)


def test_resuming_keeps_the_metrics_of_done_steps_and_sets_aside_later_and_foreign_lines(tmp_path: Path) -> None:
    """The metrics log is read back on resume: a line that is not JSON (cut by the crash, nested past the stack,
    not UTF-8) goes, and one that is JSON but not a step's record (a non-dict, a step that is not a number) is set
    aside with the lost steps' records; each of those once stopped the resumed trainer with a traceback before its
    first step."""
    from rlkit.trainer.loop_rank0 import drop_metrics_after

    metrics = tmp_path / "metrics.jsonl"
    lines = ['{"step": 1, "loss": 0.5}', '{"step": 2, "loss": 0.4}', '{"step": 3, "loss": 0.3}', "5", '["x"]',
             '{"step": "2"}', '{"step": null}', "[" * 100_000 + "]" * 100_000, '{"step": 2, "lo']
    metrics.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\n")
    drop_metrics_after(metrics, 2)
    assert metrics.read_text().splitlines() == lines[:2]
    aside = (tmp_path / "metrics.discarded.jsonl").read_text().splitlines()
    assert aside == [lines[2], *lines[3:7]]
