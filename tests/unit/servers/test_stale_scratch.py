"""A killed serve step's scratch directory is removed by the next serve step of the same user on the node
(rlkit.servers.stale_scratch); a live server's, another user's, a link, or one whose owner cannot be judged stays."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rlkit.servers.scratch import EngineScratch
from rlkit.servers.stale_scratch import OWNER_FILE, remove_stale


def _scratch_of_a_process_that_ended(tmp_path: Path) -> Path:
    """A scratch directory made by a child process that then dies by SIGKILL, as a killed serve step does."""
    code = ("import sys, os, tempfile; tempfile.tempdir = sys.argv[1]; "
            "from rlkit.servers.scratch import EngineScratch; "
            "s = EngineScratch.create('serve-9-servers/0'); (s.path / 'ipc-socket').touch(); "
            "print(s.path, flush=True); "
            "os.kill(os.getpid(), 9)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert proc.returncode == -9, proc.stderr
    return Path(proc.stdout.strip())


def test_a_killed_servers_directory_goes_and_a_live_ones_stays(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    dead = _scratch_of_a_process_that_ended(tmp_path)
    assert (dead / "ipc-socket").exists() and (dead / OWNER_FILE).exists()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    live = EngineScratch.create("serve-10-servers/1")  # this process: alive
    assert live.entries() == 0, "the owner file is not counted as the engine's"
    assert remove_stale(tmp_path, prefix="rlkit-serve-") == [dead]
    assert not dead.exists() and live.path.is_dir()
    assert remove_stale(tmp_path, prefix="rlkit-serve-") == []


def test_a_reused_pid_is_not_its_owner(tmp_path: Path) -> None:
    """Same pid, another start time: a new process that took the number, so the owner is gone."""
    d = tmp_path / "rlkit-serve-1-a"
    d.mkdir()
    pid = os.getpid()
    (d / OWNER_FILE).write_text(f"{pid} 1 {socket.gethostname()} {os.readlink('/proc/self/ns/pid')}\n")
    assert remove_stale(tmp_path) == [d]


@pytest.mark.parametrize("owner", [
    "{pid} {start} other-host {ns}",  # written on another host sharing the directory
    "{pid} {start} {host} pid:[1]",  # another pid namespace (a container's)
    "garbage",
    "",
])
def test_an_owner_that_cannot_be_judged_keeps_its_directory(tmp_path: Path, owner: str) -> None:
    d = tmp_path / "rlkit-serve-1-b"
    d.mkdir()
    gone = 4_000_000  # above any pid_max: no such process
    (d / OWNER_FILE).write_text(owner.format(pid=gone, start="5", host=socket.gethostname(),
                                             ns=os.readlink("/proc/self/ns/pid")))
    assert remove_stale(tmp_path) == [] and d.is_dir()


def test_links_directories_without_an_owner_file_and_other_names_stay(tmp_path: Path) -> None:
    line = f"4000000 5 {socket.gethostname()} {os.readlink('/proc/self/ns/pid')}\n"
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / OWNER_FILE).write_text(line)
    (tmp_path / "rlkit-serve-link").symlink_to(target, target_is_directory=True)
    (tmp_path / "rlkit-serve-no-owner").mkdir()
    other = tmp_path / "someone-else"
    other.mkdir()
    (other / OWNER_FILE).write_text(line)
    marker_link = tmp_path / "rlkit-serve-marker-link"
    marker_link.mkdir()
    (marker_link / OWNER_FILE).symlink_to(target / OWNER_FILE)
    assert remove_stale(tmp_path) == []
    assert target.is_dir() and other.is_dir() and marker_link.is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's files needs root")
def test_another_users_directory_or_owner_file_stays(tmp_path: Path) -> None:
    d = tmp_path / "rlkit-serve-1-c"
    d.mkdir()
    (d / OWNER_FILE).write_text(f"4000000 5 {socket.gethostname()} {os.readlink('/proc/self/ns/pid')}\n")
    os.chown(d, 1000, 1000)
    assert remove_stale(tmp_path) == [] and d.is_dir()
    os.chown(d, 0, 0)
    os.chown(d / OWNER_FILE, 1000, 1000)  # this user's directory, someone else's owner file
    assert remove_stale(tmp_path) == [] and d.is_dir()
    os.chown(d / OWNER_FILE, 0, 0)
    assert remove_stale(tmp_path) == [d]
