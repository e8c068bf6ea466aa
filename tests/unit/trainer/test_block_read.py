"""A rank file read back in 2 MiB blocks on several threads (rlkit.trainer.block_read through
rank_files.read_rank_file), in this process: every byte lands where it belongs across block and tensor boundaries,
whatever the thread count and however short each preadv returns; the blocks' checksum is the one written; damage,
a file of another length and a header that lies or is malformed are refused; a rank file checked by a whole-file
xxh3-128 (older rlkit versions) still loads, checked before anything is written; an interrupted read stops its
threads before it returns."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash

from rlkit.trainer import block_read
from rlkit.trainer.rank_files import DamagedCheckpoint, Piece, read_rank_file, write_rank_file
from rlkit.trials.recover_layout import BLOCK_CHECKSUM, CHECKSUM, FileDigest, file_checksum


def _tensors() -> dict[str, torch.Tensor]:
    """Tensors whose bytes straddle 2 MiB blocks, 600 tiny ones inside one block (more views than one preadv takes),
    an empty one, and a bf16 one."""
    generator = torch.Generator().manual_seed(7)
    tensors = {"model/a": torch.randn(700_001, generator=generator)}  # ends inside block 1
    tensors.update({f"model/tiny.{k:03d}": torch.randn(3, generator=generator) for k in range(600)})
    tensors["model/empty"] = torch.empty(0)
    tensors["model/b"] = torch.randn(900, 1301, generator=generator).to(torch.bfloat16)
    tensors["optim/b/exp_avg"] = torch.randn(1_100_000, generator=generator)
    tensors["optim/b/step"] = torch.tensor(4.0)
    return tensors


def _targets(tensors: dict[str, torch.Tensor], skip: str = "", transposed: str = "") -> dict[str, Piece]:
    """Zeroed targets of the same shapes; `transposed` is filled through a non-contiguous view, `skip` is left out
    (its bytes are read and hashed, then dropped)."""
    targets = {}
    for name, value in tensors.items():
        if name == skip:
            continue
        local = torch.zeros_like(value)
        if name == transposed:
            local = torch.zeros(value.shape[::-1], dtype=value.dtype).t()
            assert not local.is_contiguous()
        targets[name] = Piece(name, local, list(value.shape), "", local)
    return targets


@pytest.fixture()
def written(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor], FileDigest]:
    tensors = _tensors()
    path = tmp_path / "rank-00000-of-00001.safetensors"
    pieces = [Piece(name, value, list(value.shape), "", value) for name, value in tensors.items()]
    return path, tensors, write_rank_file(path, pieces, {"param_groups": []}, rank=0, world=1)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_byte_lands_in_its_tensor_on_any_number_of_threads(
        written: tuple[Path, dict[str, torch.Tensor], FileDigest], threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, tensors, digest = written
    data = path.read_bytes()
    blocks = [xxhash.xxh3_128(data[at:at + (2 << 20)]).digest() for at in range(0, len(data), 2 << 20)]
    assert len(blocks) == 5
    assert digest == (len(data), BLOCK_CHECKSUM, xxhash.xxh3_128(b"".join(blocks)).hexdigest())
    assert file_checksum(path, BLOCK_CHECKSUM) == digest.digest
    monkeypatch.setattr(block_read, "reader_threads", lambda: threads)
    seen: list[int] = []
    preadv = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, views, offset: seen.append(len(views)) or preadv(fd, views, offset))
    targets = _targets(tensors, skip="model/tiny.100", transposed="model/b")
    meta = read_rank_file(path, targets, digest)
    assert meta["world"] == 1
    for name, piece in targets.items():
        assert torch.equal(piece.local, tensors[name]), name
    assert max(seen) == 512, "a block of 600 tiny tensors takes two preadv calls"


def test_short_reads_are_continued_where_they_stopped(written: tuple[Path, dict[str, torch.Tensor], FileDigest],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path, tensors, digest = written
    preadv = os.preadv

    def short(fd: int, views: list[memoryview], offset: int) -> int:
        first = views[0][:4097] if len(views[0]) > 4097 else views[0]
        return preadv(fd, [first], offset)  # at most one view and 4 KiB + 1 per call

    monkeypatch.setattr(os, "preadv", short)
    targets = _targets(tensors)
    read_rank_file(path, targets, digest)
    assert all(torch.equal(piece.local, tensors[name]) for name, piece in targets.items())


def test_a_damaged_byte_is_found_in_the_same_pass(written: tuple[Path, dict[str, torch.Tensor], FileDigest]) -> None:
    path, tensors, digest = written
    data = bytearray(path.read_bytes())
    data[len(data) - 5_000] ^= 0x01  # inside optim/b/exp_avg, in the last block
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedCheckpoint, match="does not match its xxh3_128_of_2mib_blocks checksum"):
        read_rank_file(path, _targets(tensors), digest)


def test_a_file_of_another_length_or_with_a_lying_header_is_refused_before_reading(
        written: tuple[Path, dict[str, torch.Tensor], FileDigest]) -> None:
    path, tensors, digest = written
    data = path.read_bytes()
    for damaged, message in [(data + b"\0" * 8, "8 bytes after its last tensor"), (data[:-8], "ends early")]:
        path.write_bytes(damaged)
        targets = _targets(tensors)
        with pytest.raises(DamagedCheckpoint, match=message):
            read_rank_file(path, targets, digest)
        assert not any(piece.local.any() for piece in targets.values()), "nothing may be written before the check"
    length = int.from_bytes(data[:8], "little")
    for lie, message in [([4, 2_800_008], "is not where its header says"), ([0.0, 2_800_004], "has no data offsets")]:
        header = json.loads(data[8:8 + length])
        header["model/a"]["data_offsets"] = lie
        raw = json.dumps(header).encode()
        path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + length:])
        with pytest.raises(DamagedCheckpoint, match=message):
            read_rank_file(path, _targets(tensors), None)


def test_a_rank_file_of_an_older_version_is_checked_whole_before_it_is_read(
        written: tuple[Path, dict[str, torch.Tensor], FileDigest]) -> None:
    path, tensors, _digest = written
    whole = FileDigest(path.stat().st_size, CHECKSUM, xxhash.xxh3_128(path.read_bytes()).hexdigest())
    targets = _targets(tensors)
    read_rank_file(path, targets, whole)
    assert all(torch.equal(piece.local, tensors[name]) for name, piece in targets.items())
    targets = _targets(tensors)
    with pytest.raises(DamagedCheckpoint, match="does not match its xxh3_128 checksum"):
        read_rank_file(path, targets, whole._replace(digest="0" * 32))
    assert not any(piece.local.any() for piece in targets.values())


@pytest.mark.parametrize(("damage", "message"), [
    (lambda h: h["__metadata__"].update(rlkit=json.dumps({**json.loads(h["__metadata__"]["rlkit"]), "aliases": []})),
     "no readable header"),
    (lambda h: h.update({"model/a": "F32"}), "no readable header"),
    (lambda h: h["model/b"].pop("dtype"), "malformed header"),
])
def test_a_malformed_header_is_a_damaged_checkpoint_not_a_traceback(
        written: tuple[Path, dict[str, torch.Tensor], FileDigest], damage: Any, message: str) -> None:
    path, tensors, digest = written
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    damage(header)
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + length:])
    targets = _targets(tensors)
    with pytest.raises(DamagedCheckpoint, match=message):
        read_rank_file(path, targets, digest)
    assert not any(piece.local.any() for piece in targets.values())


def test_an_interrupted_read_stops_its_threads_before_closing_the_file(
        written: tuple[Path, dict[str, torch.Tensor], FileDigest], monkeypatch: pytest.MonkeyPatch) -> None:
    path, tensors, digest = written
    join = threading.Thread.join
    interrupted: list[bool] = []

    def interrupt_once(thread: threading.Thread, timeout: float | None = None) -> None:
        if thread.name.startswith("rlkit-read-") and not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        join(thread, timeout)

    preadv = os.preadv

    def slow(fd: int, views: list[memoryview], offset: int) -> int:
        time.sleep(0.05)  # the threads are still reading when the caller is interrupted
        return preadv(fd, views, offset)

    monkeypatch.setattr(block_read, "reader_threads", lambda: 2)
    monkeypatch.setattr(os, "preadv", slow)
    monkeypatch.setattr(threading.Thread, "join", interrupt_once)
    with pytest.raises(KeyboardInterrupt):
        read_rank_file(path, _targets(tensors), digest)
    assert interrupted and not [t for t in threading.enumerate() if t.name.startswith("rlkit-read-")]
