"""Issue 47's isolation that must hold beyond the attack suite: "required" hides what must be hidden (a directory
that holds the interpreter or the scratch root is hidden around them, datasets after links, relative paths and a
Hugging Face cache's layout) or refuses the run; and a run's memory, every path it can take tried at once, stays
within the bound the README states: memory_mb + 256 MiB of address space, the scratch's bytes and inodes, pipes."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlkit.agent.code_tool import CodeLimits, run_python
from rlkit.agent.sandbox_mounts import scratch_inodes
from rlkit.agent.sandbox_paths import dataset_paths

SECRET = "rlkit-isolation-secret-8c2e"
MIB = 1 << 20


@pytest.fixture
def layout() -> Iterator[Path]:
    """A directory every user can traverse: a venv-like interpreter prefix, a scratch root and a secret side by
    side, as a non-root user's trial directory may hold them."""
    root = Path(tempfile.mkdtemp(prefix="rlkit-isolation-"))
    root.chmod(0o755)
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "venv" / "bin" / "python").symlink_to("/usr/bin/python3")
    (root / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "scratch").mkdir(mode=0o711)
    (root / "scratch").chmod(0o711)
    (root / "secret").mkdir(mode=0o755)
    (root / "secret" / "token").write_text(SECRET)
    (root / "secret" / "token").chmod(0o644)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _read(path: Path, layout: Path, hide: list[str], isolation: str = "required") -> tuple[str, object]:
    result = run_python(f"print(open({str(path)!r}).read())", limits=CodeLimits(), scratch_root=layout / "scratch",
                        python=str(layout / "venv" / "bin" / "python"), hide=hide, isolation=isolation)
    return result.output + (result.error or ""), result


def test_a_hidden_directory_holding_the_interpreter_and_the_scratch_root_is_hidden_around_them(layout: Path) -> None:
    text, result = _read(layout / "secret" / "token", layout, [str(layout)])
    assert SECRET not in text and "No such file" in text, text
    assert result.isolated and not result.notes, result
    ran, _ = _read(layout / "venv" / "pyvenv.cfg", layout, [str(layout)])  # the interpreter's prefix stays
    assert "home = /usr/bin" in ran


def test_a_path_that_cannot_be_hidden_refuses_the_run_under_required_and_is_noted_under_best_effort(
        layout: Path) -> None:
    text, result = _read(layout / "secret" / "token", layout, [str(layout / "venv")])  # the prefix itself
    assert text.startswith("the code was not run") and "is what the run needs" in text, text
    text, result = _read(layout / "venv" / "pyvenv.cfg", layout, [str(layout / "venv")], "best_effort")
    assert "home = /usr/bin" in text and any("stays visible" in n for n in result.notes), result


def test_a_dataset_in_a_hugging_face_cache_is_hidden_with_its_blobs_and_a_relative_path_too(
        layout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = layout / "hub" / "datasets--org--math"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "0f3a").write_text(SECRET)
    (repo / "snapshots" / "rev1").mkdir(parents=True)
    (repo / "snapshots" / "rev1" / "train.jsonl").symlink_to("../../blobs/0f3a")
    for path in (layout / "hub", repo, repo / "blobs", repo / "snapshots", repo / "snapshots" / "rev1"):
        path.chmod(0o755)
    (repo / "blobs" / "0f3a").chmod(0o644)
    monkeypatch.chdir(layout / "hub")
    relative = "datasets--org--math/snapshots/rev1/train.jsonl"
    assert str(repo) in dataset_paths(relative)
    for target in (repo / "blobs" / "0f3a", repo / "snapshots" / "rev1" / "train.jsonl"):
        text, _ = _read(target, layout, dataset_paths(relative))
        assert SECRET not in text and "No such file" in text, text
    data = layout / "data"  # a plain dataset directory whose files link out of it
    data.mkdir(mode=0o755)
    (data / "test.jsonl").symlink_to(repo / "blobs" / "0f3a")
    assert str(repo / "blobs") in dataset_paths(str(data))


BOMB = r"""
import ctypes, json, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
M = 1 << 20
got, held = {}, []
def take(name, make, unit, tries):
    n = 0
    try:
        for _ in range(tries):
            if make() is False:
                break
            n += 1
    except (OSError, MemoryError, ValueError):
        pass
    got[name] = n * unit
def shm():
    i = libc.syscall(29, 0, 16 * M, 0o1600)
    if i < 0:
        return False
    p = libc.shmat(i, None, 0)
    if p in (None, ctypes.c_void_p(-1).value):
        return False
    ctypes.memset(p, 1, 16 * M)
    libc.shmdt(ctypes.c_void_p(p))
def secret():
    fd = libc.syscall(447, 0)
    if fd < 0:
        return False
    os.ftruncate(fd, 16 * M)
    m = mmap.mmap(fd, 16 * M)
    m[::4096] = b'x' * (16 * M // 4096)
    m.close()  # the fd keeps the memory: no address space held
def memfd():
    fd = os.memfd_create('m')
    os.write(fd, b'x' * M)
def shared():
    m = mmap.mmap(-1, 16 * M, flags=mmap.MAP_SHARED)
    m[::4096] = b'x' * (16 * M // 4096)
    held.append(m)
def msg():
    if libc.syscall(68, 0, 0o1600) < 0:
        return False
def xattr():
    os.setxattr('x', 'user.a%d' % len(held), b'x' * 60000)
    held.append(None)
def pipe():
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b'x' * 65536)
    except BlockingIOError:
        pass
open('x', 'w').close()
take('sysv shm', shm, 16 * M, 24)  # first the paths that hold no address space once made
take('memfd_secret', secret, 16 * M, 24)
take('memfd', memfd, M, 64)
take('sysv msg', msg, 16 * 8192, 64)
take('xattrs', xattr, 60000, 64)
take('heap', lambda: held.append(bytearray(16 * M)), 16 * M, 40)
take('shared', shared, 16 * M, 40)
take('scratch files', lambda: open('f%d' % len(held), 'wb').write(b'x' * M) and held.append(None), M, 64)
take('scratch inodes', lambda: open('e%d' % len(held), 'w').close() or held.append(None), 1024, 5000)
take('pipes', pipe, 65536, 200)
print(json.dumps(got))
"""


def test_every_memory_path_at_once_stays_within_the_stated_bound() -> None:
    """The code takes all it can by each path (its heap, shared mappings, System V shared memory and message
    queues, memfds, memfd_secret, user xattrs, scratch files and empty files, pipes) and says what it got; the
    total stays within memory_mb + 256 MiB (RLIMIT_AS) + scratch_mb (bytes) + its inodes (one per 16 KiB of
    scratch_mb, at least 1024, at ~1 KiB of kernel memory each) + 16 MiB (pipes within RLIMIT_NOFILE at 64 KiB
    each), and the paths outside every limit got nothing."""
    root = Path(tempfile.mkdtemp(prefix="rlkit-bound-"))
    root.chmod(0o711)
    try:
        limits = CodeLimits(memory_mb=64, scratch_mb=8, file_mb=8, wall_seconds=60, cpu_seconds=60)
        result = run_python(BOMB, limits=limits, scratch_root=root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    got = json.loads(result.output.strip().splitlines()[-1])
    assert {name: got[name] for name in ("sysv shm", "memfd_secret", "memfd", "sysv msg", "xattrs")} == dict.fromkeys(
        ("sysv shm", "memfd_secret", "memfd", "sysv msg", "xattrs"), 0), got
    inodes = scratch_inodes(8 * MIB) * 1024
    assert 0 < got["scratch inodes"] <= inodes, got
    bound = (64 + 256 + 8 + 16) * MIB + inodes
    assert got["heap"] > 0 and got["scratch files"] > 0 and sum(got.values()) <= bound, (sum(got.values()) / MIB, got)
