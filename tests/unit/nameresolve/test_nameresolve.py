"""Unit tests of the NFS name resolve (run on the local disk; no long fixed sleeps: everything polls a deadline)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlkit.errors import ConfigError, StepError
from rlkit.nameresolve import (
    NameEntryExistsError,
    NameEntryNotFoundError,
    NameResolve,
    NameResolveError,
    NameResolveTimeoutError,
    NfsNameResolve,
    make_name_resolve,
)
from rlkit.nameresolve.etcd import Etcd3NameResolve
from tests.conftest import REPO

TTL = 0.5
HEARTBEAT = 0.1


def poll_until(pred: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02) -> float:
    """Call ``pred`` until it is true; return the seconds it took, fail the test after ``timeout``."""
    start = time.monotonic()
    while not pred():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
    return time.monotonic() - start


def patient_reader(tmp_path: Path) -> NfsNameResolve:
    """A reader of the trial's entries whose ttl a busy machine cannot outlast: with TTL's 0.5 s, a read right after
    an add once found the new entry expired (the suite's other lane shares the two cores and the writer was not
    scheduled for 0.5 s). For checks of what an entry holds, not of when it expires."""
    return NfsNameResolve(tmp_path, "exp", "trial", ttl=60.0)


def is_gone(nr: NameResolve, key: str) -> bool:
    try:
        nr.get(key)
    except NameEntryNotFoundError:
        return True
    return False


def read_record(nr: NfsNameResolve, key: str) -> dict:
    return json.loads(Path(nr.path_of(key)).read_text())


@pytest.fixture
def nr(tmp_path: Path):
    with NfsNameResolve(tmp_path, "exp", "trial", ttl=TTL, heartbeat_interval=HEARTBEAT) as resolver:
        yield resolver


# -- add / get / replace / delete ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        '{"address": "10.0.0.1:8000", "backend": "vllm", "model": "m", "weight_version": 3}',
        "",
        "é ü 中文\n\ttab",
        "x" * 100_000,
        "\\ \" ' \x00 \ud800",
    ],
)
def test_add_get_returns_exact_value(nr: NfsNameResolve, value: str) -> None:
    nr.add("servers/0", value)
    assert nr.get("servers/0") == value


def test_record_on_disk_has_owner_metadata(nr: NfsNameResolve, tmp_path: Path) -> None:
    before = time.time()
    nr.add("servers/0", "v")
    path = Path(nr.path_of("servers/0"))
    assert path.parent == tmp_path / "exp" / "trial"
    rec = json.loads(path.read_text())
    assert rec["value"] == "v" and rec["key"] == "servers/0" and rec["keepalive"] is False
    assert rec["owner"]["hostname"] == socket.gethostname()
    assert rec["owner"]["pid"] == os.getpid()
    assert before - 1 <= rec["owner"]["created"] <= time.time() + 1
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")], "temp file left behind"


def test_add_existing_raises_unless_replace(nr: NfsNameResolve) -> None:
    nr.add("servers/0", "a")
    with pytest.raises(NameEntryExistsError, match="servers/0"):
        nr.add("servers/0", "b")
    assert nr.get("servers/0") == "a"
    nr.add("servers/0", "b", replace=True)
    assert nr.get("servers/0") == "b"


def test_get_missing_raises_not_found(nr: NfsNameResolve) -> None:
    with pytest.raises(NameEntryNotFoundError) as ei:
        nr.get("servers/9")
    assert isinstance(ei.value, KeyError)
    assert "servers/9" in str(ei.value) and not str(ei.value).startswith("'")


def test_delete_and_clear_subtree(nr: NfsNameResolve) -> None:
    for k in ["servers/0", "servers/1", "serversX", "other/0"]:
        nr.add(k, k)
    nr.delete("servers/0")
    assert is_gone(nr, "servers/0")
    with pytest.raises(NameEntryNotFoundError):
        nr.delete("servers/0")
    nr.clear_subtree("servers")
    assert nr.list_subtree("") == {"other/0": "other/0", "serversX": "serversX"}
    nr.clear_subtree("nothing/here")  # no error
    nr.clear_subtree("")
    assert nr.list_subtree("") == {}


@pytest.mark.parametrize("key", ["", "/abs", "/", "..", "../x", "a/../b", "a/..", ".", "a/./b", "a//b", "a/", "a\x00b"])
def test_invalid_keys_rejected(nr: NfsNameResolve, key: str) -> None:
    with pytest.raises(ValueError):
        nr.add(key, "v")
    with pytest.raises(ValueError):
        nr.get(key)
    with pytest.raises(ValueError):
        nr.delete(key)
    with pytest.raises(ValueError):
        nr.wait(key, timeout=0.01)
    assert not Path(nr.directory).exists() or not any(Path(nr.directory).iterdir())


@pytest.mark.parametrize("prefix", ["/abs", "..", "a/../b", "a//"])
def test_invalid_prefix_rejected(nr: NfsNameResolve, prefix: str) -> None:
    with pytest.raises(ValueError):
        nr.list_subtree(prefix)
    with pytest.raises(ValueError):
        nr.clear_subtree(prefix)


def test_odd_but_valid_keys_roundtrip(nr: NfsNameResolve) -> None:
    keys = ["a:b", "a%2Fb", "a b/c", "x.rec", "x.rec/y", "x", ".hidden", "ü/中", "a.tmp"]
    for k in keys:
        nr.add(k, "v:" + k)
    assert nr.list_subtree("") == {k: "v:" + k for k in sorted(keys)}
    assert nr.list_subtree("x.rec") == {"x.rec": "v:x.rec", "x.rec/y": "v:x.rec/y"}


def test_bad_constructor_arguments(tmp_path: Path) -> None:
    for exp, trial in [("", "t"), ("e", ""), ("a/b", "t"), ("e", ".."), ("..", "t")]:
        with pytest.raises(ValueError):
            NfsNameResolve(tmp_path, exp, trial)
    with pytest.raises(ValueError):
        NfsNameResolve(tmp_path, "e", "t", ttl=1.0, heartbeat_interval=1.0)


# -- wait ------------------------------------------------------------------------------------------------------------


def test_wait_returns_when_another_thread_adds_later(nr: NfsNameResolve, tmp_path: Path) -> None:
    writer = NfsNameResolve(tmp_path, "exp", "trial")
    timer = threading.Timer(0.3, writer.add, args=("servers/0", "http://h:1"))
    start = time.monotonic()  # before the timer starts: the entry appears no sooner than 0.3 s after this
    timer.start()
    try:
        assert nr.wait("servers/0", timeout=20, poll=0.02) == "http://h:1"
        elapsed = time.monotonic() - start
    finally:
        timer.cancel()
        writer.close()
    assert 0.29 <= elapsed < 10


def test_wait_timeout_message(nr: NfsNameResolve) -> None:
    nr.add("servers/1", "v")
    start = time.monotonic()
    with pytest.raises(NameResolveTimeoutError) as ei:
        nr.wait("servers/0", timeout=0.3, poll=0.05)
    assert time.monotonic() - start >= 0.3
    msg = str(ei.value)
    assert isinstance(ei.value, StepError) and ei.value.exit_code == 1
    assert "'servers/0'" in msg
    assert nr.directory in msg and os.path.isabs(nr.directory)
    assert "0.3 s" in msg
    assert "'servers/1'" in msg  # what the directory does hold


def test_wait_timeout_names_missing_directory(tmp_path: Path) -> None:
    reader = NfsNameResolve(tmp_path / "not-mounted", "exp", "trial")
    with pytest.raises(NameResolveTimeoutError, match="does not exist") as ei:
        reader.wait("servers/0", timeout=0.05)
    assert str(tmp_path / "not-mounted" / "exp" / "trial") in str(ei.value)
    assert not (tmp_path / "not-mounted").exists()  # a reader creates nothing


# -- list_subtree ----------------------------------------------------------------------------------------------------


def test_list_subtree_prefix_semantics(nr: NfsNameResolve) -> None:
    for k in ["servers/1", "servers/0", "serversX", "servers/sub/2", "servers", "other/servers/3", "serv"]:
        nr.add(k, "v" + k)
    expected = {
        "servers": "vservers",
        "servers/0": "vservers/0",
        "servers/1": "vservers/1",
        "servers/sub/2": "vservers/sub/2",
    }
    got = nr.list_subtree("servers")
    assert got == expected and list(got) == sorted(expected)
    assert nr.list_subtree("servers/") == expected
    assert nr.list_subtree("servers/sub") == {"servers/sub/2": "vservers/sub/2"}
    assert nr.list_subtree("serv") == {"serv": "vserv"}
    assert nr.list_subtree("nothing") == {}
    everything = nr.list_subtree("")
    assert len(everything) == 7 and list(everything) == sorted(everything)


def test_list_subtree_missing_directory_is_empty(tmp_path: Path) -> None:
    assert NfsNameResolve(tmp_path / "nope", "e", "t").list_subtree("") == {}


def test_list_subtree_filters_stale_entries(nr: NfsNameResolve, tmp_path: Path) -> None:
    owner = NfsNameResolve(tmp_path, "exp", "trial", ttl=TTL, heartbeat_interval=HEARTBEAT)
    owner.add("servers/0", "dead-soon", keepalive=True)
    nr.add("servers/1", "static")
    assert nr.list_subtree("servers") == {"servers/0": "dead-soon", "servers/1": "static"}
    owner._stop_heartbeat()
    poll_until(lambda: "servers/0" not in nr.list_subtree("servers"))
    assert nr.list_subtree("servers") == {"servers/1": "static"}
    assert os.path.exists(nr.path_of("servers/0"))  # filtered, not deleted
    owner.close()


@pytest.mark.parametrize("heartbeat", ["Infinity", "1e400", "NaN"])
def test_a_keepalive_record_whose_heartbeat_is_not_finite_is_skipped_with_a_warning(
        nr: NfsNameResolve, heartbeat: str, caplog: pytest.LogCaptureFixture) -> None:
    """An infinite heartbeat (a crashed writer's, a clock gone wrong) would keep a dead owner's entry live for good;
    a NaN one made a live entry vanish without a word."""
    nr.add("servers/0", "v", keepalive=True)
    nr._stop_heartbeat()
    path = Path(nr.path_of("servers/0"))
    path.write_text(path.read_text().replace(f'"heartbeat": {read_record(nr, "servers/0")["heartbeat"]!r}',
                                             f'"heartbeat": {heartbeat}'))
    assert heartbeat in path.read_text()
    with caplog.at_level("WARNING"):
        assert nr.list_subtree("servers") == {}
    assert "without a finite numeric 'heartbeat'" in caplog.text


def test_list_subtree_1000_entries(nr: NfsNameResolve) -> None:
    """Every one of 1,000 entries, and none of a sibling prefix (its speed, against a bare-scandir floor, is
    bench/bench_nameresolve.py's: a time limit here failed on a loaded machine)."""
    for i in range(1000):
        nr.add(f"servers/{i}", json.dumps({"address": f"10.0.{i // 256}.{i % 256}:8000"}))
    nr.add("serversX", "no")
    got = nr.list_subtree("servers")
    assert len(got) == 1000 and "serversX" not in got
    assert json.loads(got["servers/999"])["address"] == "10.0.3.231:8000"


# -- keepalive / heartbeat -------------------------------------------------------------------------------------------


def test_keepalive_entry_stays_live_while_heartbeating(tmp_path: Path) -> None:
    # a ttl of 15 heartbeats, not 5: with the whole suite on two cores, the heartbeat thread once went 0.5 s unrun
    ttl = 15 * HEARTBEAT
    owner = NfsNameResolve(tmp_path, "exp", "trial", ttl=ttl, heartbeat_interval=HEARTBEAT)
    reader = NfsNameResolve(tmp_path, "exp", "trial", ttl=ttl, heartbeat_interval=HEARTBEAT)
    owner.add("servers/0", "alive", keepalive=True)
    first = read_record(reader, "servers/0")["heartbeat"]
    start = time.monotonic()
    while time.monotonic() - start < 2 * ttl:  # past one ttl: only the heartbeat keeps it live
        assert reader.get("servers/0") == "alive"
        time.sleep(0.05)
    rec = read_record(reader, "servers/0")
    assert rec["heartbeat"] > first + ttl
    assert rec["owner"]["pid"] == os.getpid() and rec["keepalive"] is True
    owner.close()
    reader.close()


def test_keepalive_entry_expires_when_heartbeat_stops(nr: NfsNameResolve, tmp_path: Path) -> None:
    owner = NfsNameResolve(tmp_path, "exp", "trial", ttl=TTL, heartbeat_interval=HEARTBEAT)
    owner.add("servers/0", "v", keepalive=True)
    nr.add("static", "forever")
    assert nr.get("servers/0") == "v"
    owner._stop_heartbeat()
    poll_until(lambda: is_gone(nr, "servers/0"))
    # not before the ttl ran out since the last heartbeat (measured from the record, not from `_stop_heartbeat`: on a
    # loaded machine the heartbeat thread may have written its last beat well before it was told to stop)
    assert time.time() - read_record(nr, "servers/0")["heartbeat"] > TTL
    assert os.path.exists(nr.path_of("servers/0"))  # expired, not deregistered
    with pytest.raises(NameResolveTimeoutError, match="looks dead"):
        nr.wait("servers/0", timeout=0.1)
    assert nr.get("static") == "forever"  # entries without keepalive never expire
    owner.close()


OWNER_SCRIPT = """
import sys, time
from rlkit.nameresolve import NfsNameResolve

nr = NfsNameResolve(sys.argv[1], "exp", "trial", ttl={ttl}, heartbeat_interval={hb})
nr.add("servers/0", "http://10.0.0.1:8000", keepalive=True)
print("ready", flush=True)
sys.stdin.read()  # until SIGKILLed by the test (or its parent goes away and the pipe closes)
"""


def test_keepalive_entry_expires_after_owner_is_sigkilled(nr: NfsNameResolve, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT.format(ttl=TTL, hb=HEARTBEAT), str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        first = read_record(nr, "servers/0")["heartbeat"]
        # the subprocess heartbeats: live beyond one ttl
        poll_until(lambda: read_record(nr, "servers/0")["heartbeat"] > first + TTL)
        assert nr.get("servers/0") == "http://10.0.0.1:8000"
        assert read_record(nr, "servers/0")["owner"]["pid"] == proc.pid
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        poll_until(lambda: is_gone(nr, "servers/0"))
        assert os.path.exists(nr.path_of("servers/0"))  # it had no chance to deregister: expiry did it
        assert nr.list_subtree("servers") == {}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_close_deregisters_keepalive_entries_only(nr: NfsNameResolve, tmp_path: Path) -> None:
    owner = NfsNameResolve(tmp_path, "exp", "trial", ttl=TTL, heartbeat_interval=HEARTBEAT)
    owner.add("servers/0", "ka", keepalive=True)
    owner.add("config", "static")
    owner.close()
    assert is_gone(nr, "servers/0") and not os.path.exists(nr.path_of("servers/0"))
    assert nr.get("config") == "static"
    owner.close()  # idempotent
    with pytest.raises(NameResolveError):
        owner.add("servers/1", "x", keepalive=True)


def test_context_manager_deregisters(nr: NfsNameResolve, tmp_path: Path) -> None:
    with NfsNameResolve(tmp_path, "exp", "trial", ttl=TTL, heartbeat_interval=HEARTBEAT) as owner:
        owner.add("servers/0", "ka", keepalive=True)
        assert patient_reader(tmp_path).get("servers/0") == "ka"
    assert is_gone(nr, "servers/0")


def test_close_does_not_delete_an_entry_taken_over_by_another_owner(nr: NfsNameResolve, tmp_path: Path) -> None:
    owner = NfsNameResolve(tmp_path, "exp", "trial", ttl=TTL, heartbeat_interval=HEARTBEAT)
    owner.add("servers/0", "old", keepalive=True)
    nr.add("servers/0", "new", replace=True)
    owner.close()
    assert nr.get("servers/0") == "new"


def test_heartbeat_writes_again_an_entry_something_else_removed(nr: NfsNameResolve, tmp_path: Path) -> None:
    """A scratch cleaner removing the record file, then the whole record directory, while its owner lives: the next
    heartbeat writes the entry again (same owner token) and keeps heart-beating it."""
    owner = NfsNameResolve(tmp_path, "exp", "trial", ttl=TTL, heartbeat_interval=HEARTBEAT)
    owner.add("servers/0", "v", keepalive=True)
    first = read_record(nr, "servers/0")
    os.unlink(nr.path_of("servers/0"))
    poll_until(lambda: os.path.exists(nr.path_of("servers/0")))
    assert nr.get("servers/0") == "v" and owner._ka.rewritten == 1
    shutil.rmtree(nr.directory)
    poll_until(lambda: os.path.exists(nr.path_of("servers/0")))
    assert stat.S_IMODE(os.stat(nr.directory).st_mode) == 0o700
    again = read_record(nr, "servers/0")
    assert again["owner"]["token"] == first["owner"]["token"] and owner._ka.rewritten == 2
    poll_until(lambda: read_record(nr, "servers/0")["heartbeat"] > again["heartbeat"])  # still heart-beating
    owner.close()
    assert not os.path.exists(nr.path_of("servers/0"))


def test_heartbeat_lets_go_of_an_entry_another_owner_took(nr: NfsNameResolve, tmp_path: Path) -> None:
    owner = NfsNameResolve(tmp_path, "exp", "trial", ttl=TTL, heartbeat_interval=HEARTBEAT)
    owner.add("servers/0", "v", keepalive=True)
    nr.add("servers/0", "theirs", replace=True)
    poll_until(lambda: "servers/0" not in owner._ka.owned)  # the heartbeat noticed and let go
    time.sleep(3 * HEARTBEAT)
    assert nr.get("servers/0") == "theirs" and owner._ka.rewritten == 0
    owner.close()
    assert nr.get("servers/0") == "theirs"


def test_stale_entry_is_taken_over_without_replace(tmp_path: Path) -> None:
    # the taker judges staleness by its ttl: 15 heartbeats, not TTL's 5 (a heartbeat thread left unrun 0.5 s under
    # the suite's load made the live entry look stale, and the first add was not refused)
    owner = NfsNameResolve(tmp_path, "exp", "trial", ttl=15 * HEARTBEAT, heartbeat_interval=HEARTBEAT)
    with NfsNameResolve(tmp_path, "exp", "trial", ttl=15 * HEARTBEAT, heartbeat_interval=HEARTBEAT) as taker:
        owner.add("servers/0", "old", keepalive=True)
        with pytest.raises(NameEntryExistsError):
            taker.add("servers/0", "new")
        owner._stop_heartbeat()
        poll_until(lambda: is_gone(taker, "servers/0"))
        taker.add("servers/0", "new", keepalive=True)
        reader = patient_reader(tmp_path)  # what is checked is whose record the file holds
        assert reader.get("servers/0") == "new"
        owner.close()  # must not remove the new owner's entry
        assert reader.get("servers/0") == "new"


def test_trials_do_not_see_each_other(tmp_path: Path) -> None:
    a = NfsNameResolve(tmp_path, "exp", "trial-a")
    b = NfsNameResolve(tmp_path, "exp", "trial-b")
    c = NfsNameResolve(tmp_path, "exp2", "trial-a")
    a.add("servers/0", "a")
    b.add("servers/0", "b")
    assert a.get("servers/0") == "a" and b.get("servers/0") == "b"
    assert is_gone(c, "servers/0")
    assert a.list_subtree("") == {"servers/0": "a"}
    b.clear_subtree("")
    assert a.get("servers/0") == "a"
    with pytest.raises(NameEntryNotFoundError):
        b.delete("servers/0")


# -- concurrency across processes ----------------------------------------------------------------------------------


def _writer(root: str, wid: int, rounds: int, size: int) -> None:
    nr = NfsNameResolve(root, "exp", "trial")
    ch = "abcdefghijklmnop"[wid]
    for i in range(rounds):
        body = ch * (size + i)
        value = f"{wid}:{i}:{len(body)}:{body}"
        nr.add("shared", value, replace=True)
        nr.add(f"w/{wid}", value, replace=True)


def _check_value(value: str) -> None:
    wid, _i, n, body = value.split(":", 3)
    assert len(body) == int(n), "torn read: wrong length"
    assert body == "abcdefghijklmnop"[int(wid)] * int(n), "torn read: mixed content"


def test_concurrent_writers_never_produce_torn_reads(nr: NfsNameResolve, tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 150, 64 * 1024)) for w in range(4)]
    for p in procs:
        p.start()
    reads = 0
    seen_shared = False
    deadline = time.monotonic() + 120
    try:
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            try:
                _check_value(nr.get("shared"))
                seen_shared = True
                reads += 1
            except NameEntryNotFoundError:
                assert not seen_shared, "a replaced entry was briefly missing"
            for value in nr.list_subtree("w").values():
                _check_value(value)
                reads += 1
    finally:
        for p in procs:
            p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert reads > 0
    final = nr.list_subtree("w")
    assert sorted(final) == ["w/0", "w/1", "w/2", "w/3"]
    for value in [*final.values(), nr.get("shared")]:
        _check_value(value)
    assert not [p for p in Path(nr.directory).iterdir() if p.name.endswith(".tmp")], "temp files left behind"


def _racer(root: str, wid: int, start: Any, results: Any) -> None:
    nr = NfsNameResolve(root, "exp", "trial")
    start.wait()
    try:
        nr.add("leader", str(wid))
        results.put((wid, "won"))
    except NameEntryExistsError:
        results.put((wid, "lost"))
    except Exception as e:  # report instead of leaving the parent waiting
        results.put((wid, f"error: {e!r}"))


def test_concurrent_create_exactly_one_wins(nr: NfsNameResolve, tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(tmp_path), w, start, results)) for w in range(6)]
    for p in procs:
        p.start()
    start.set()
    outcome = dict(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    winners = [w for w, o in outcome.items() if o == "won"]
    assert len(winners) == 1, outcome
    assert nr.get("leader") == str(winners[0])


# -- factory ---------------------------------------------------------------------------------------------------------


def test_make_name_resolve(tmp_path: Path) -> None:
    """Records go to <trial dir>/name_resolve/ by default, below <nfs_record_root>/<uid>/ when that is set; both
    private (directories 0700, records 0600)."""
    trial_dir = tmp_path / "fileroot" / "e" / "t"
    trial_dir.mkdir(parents=True, mode=0o700)
    default = make_name_resolve("nfs", trial_dir=trial_dir, experiment="e", trial="t", ttl=2.0, heartbeat_interval=0.5)
    assert isinstance(default, NfsNameResolve) and default.ttl == 2.0
    default.add("k", "v")
    assert Path(default.path_of("k")).parent == trial_dir / "name_resolve"
    shared = make_name_resolve("nfs", trial_dir=trial_dir, nfs_record_root=str(tmp_path / "shared"), experiment="e",
                               trial="t")
    assert isinstance(shared, NfsNameResolve)
    shared.add("k", "v")
    private = tmp_path / "shared" / str(os.getuid())
    assert Path(shared.path_of("k")).parent == private / "e" / "t"
    for directory in (trial_dir / "name_resolve", private, private / "e", private / "e" / "t"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    for nr in (default, shared):
        assert stat.S_IMODE(os.stat(nr.path_of("k")).st_mode) == 0o600
    with pytest.raises(ConfigError, match="unknown"):
        make_name_resolve("zookeeper", trial_dir=trial_dir, experiment="e", trial="t")
    with pytest.raises(ConfigError, match="nfs_record_root"):
        make_name_resolve("nfs", nfs_record_root="", etcd3_addr="", experiment="e", trial="t")


# -- etcd v3 (scripts/dev-env.sh installs etcd-server; a missing binary fails) ----------------------


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def etcd_addr(tmp_path_factory: pytest.TempPathFactory):
    exe = shutil.which("etcd")
    if exe is None:
        pytest.fail("etcd is not installed: run scripts/dev-env.sh (apt-get install -y etcd-server)")
    data = tmp_path_factory.mktemp("etcd")
    client, peer = _free_ports(2)
    cmd = [
        exe, "--name", "t", "--data-dir", str(data / "data"),
        "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"t=http://127.0.0.1:{peer}",
    ]  # fmt: skip
    with open(data / "etcd.log", "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)

    def healthy() -> bool:
        assert proc.poll() is None, (data / "etcd.log").read_text()[-2000:]
        try:
            return httpx.get(f"http://127.0.0.1:{client}/health", timeout=1).json().get("health") == "true"
        except (httpx.HTTPError, ValueError):
            return False

    try:
        poll_until(healthy, timeout=30, interval=0.1)
        yield f"127.0.0.1:{client}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def etcd_nr(etcd_addr: str):
    trial = f"t-{uuid.uuid4().hex[:12]}"
    with Etcd3NameResolve(etcd_addr, "exp", trial, ttl=1.0, heartbeat_interval=0.2) as resolver:
        resolver.clear_subtree("")
        yield resolver
        resolver.clear_subtree("")


def test_etcd_add_get_replace_delete(etcd_nr: Etcd3NameResolve) -> None:
    value = '{"address": "10.0.0.1:8000"} é\n'
    etcd_nr.add("servers/0", value)
    assert etcd_nr.get("servers/0") == value
    with pytest.raises(NameEntryExistsError):
        etcd_nr.add("servers/0", "b")
    etcd_nr.add("servers/0", "b", replace=True)
    assert etcd_nr.get("servers/0") == "b"
    etcd_nr.delete("servers/0")
    with pytest.raises(NameEntryNotFoundError):
        etcd_nr.get("servers/0")
    with pytest.raises(NameEntryNotFoundError):
        etcd_nr.delete("servers/0")
    with pytest.raises(ValueError):
        etcd_nr.add("../x", "v")


def test_etcd_list_and_clear_subtree(etcd_nr: Etcd3NameResolve) -> None:
    for k in ["servers/1", "servers/0", "serversX", "servers/sub/2", "servers", "other/0"]:
        etcd_nr.add(k, "v" + k)
    expected = {
        "servers": "vservers",
        "servers/0": "vservers/0",
        "servers/1": "vservers/1",
        "servers/sub/2": "vservers/sub/2",
    }
    got = etcd_nr.list_subtree("servers")
    assert got == expected and list(got) == sorted(got)
    assert etcd_nr.list_subtree("servers/") == expected
    etcd_nr.clear_subtree("servers")
    assert etcd_nr.list_subtree("") == {"other/0": "vother/0", "serversX": "vserversX"}


def test_etcd_keepalive_expires_when_lease_is_not_renewed(etcd_nr: Etcd3NameResolve, etcd_addr: str) -> None:
    owner = Etcd3NameResolve(etcd_addr, "exp", etcd_nr.base.split("/")[3], ttl=1.0, heartbeat_interval=0.2)
    owner.add("servers/0", "alive", keepalive=True)
    etcd_nr.add("static", "forever")
    start = time.monotonic()
    while time.monotonic() - start < 3.0:  # longer than the granted lease TTL (etcd's minimum is ~2 s)
        assert etcd_nr.get("servers/0") == "alive"
        time.sleep(0.05)
    owner._stop_heartbeat()
    poll_until(lambda: is_gone(etcd_nr, "servers/0"), timeout=15)
    assert etcd_nr.list_subtree("") == {"static": "forever"}
    owner.close()


def test_etcd_close_deregisters_and_wait_times_out(etcd_nr: Etcd3NameResolve, etcd_addr: str) -> None:
    trial = etcd_nr.base.split("/")[3]
    with Etcd3NameResolve(etcd_addr, "exp", trial, ttl=5.0, heartbeat_interval=1.0) as owner:
        owner.add("servers/0", "ka", keepalive=True)
        owner.add("config", "static")
        assert etcd_nr.wait("servers/0", timeout=5) == "ka"
    assert etcd_nr.list_subtree("") == {"config": "static"}
    with pytest.raises(NameResolveTimeoutError) as ei:
        etcd_nr.wait("servers/0", timeout=0.2, poll=0.05)
    assert "'servers/0'" in str(ei.value) and etcd_nr.base in str(ei.value) and "0.2 s" in str(ei.value)
    other = make_name_resolve("etcd3", nfs_record_root="", etcd3_addr=etcd_addr, experiment="exp", trial=trial + "x")
    assert isinstance(other, Etcd3NameResolve) and other.list_subtree("") == {}  # trials do not see each other
    other.close()
