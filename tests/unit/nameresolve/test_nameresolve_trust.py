"""Name-resolve records another user could have written are never believed: owner, mode, format and address are
checked, a bad record is skipped with one warning, and nothing ever contacts the address it names."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlkit.config.load import load_config
from rlkit.launch.render import step_command
from rlkit.nameresolve import (
    NameEntryNotFoundError,
    NameResolveError,
    NameResolveTimeoutError,
    NfsNameResolve,
    check_address,
    server_key,
)
from rlkit.nameresolve.servers import http_url
from rlkit.servers.pool import discover_servers, wait_for_servers
from tests.conftest import CONFIGS
from tests.helpers.planning import plan_of
from tests.helpers.planted import OTHER_UID, Listener, plant_rlkit_package, plant_server_records


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def healthy_server() -> Iterator[str]:
    """A real HTTP server answering /health: what a registered inference server looks like to discovery."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def records(tmp_path: Path) -> Iterator[NfsNameResolve]:
    """The default layout: a 0700 trial directory with its records in name_resolve/."""
    trial = tmp_path / "trial"
    trial.mkdir(mode=0o700)
    with NfsNameResolve(trial / "name_resolve") as nr:
        yield nr


def _register(nr: NfsNameResolve, index: int, address: str) -> None:
    entry = {"index": index, "address": address, "backend": "vllm", "model": "/m", "weight_version": 0}
    nr.add(server_key(index), json.dumps(entry), keepalive=True)


def test_planted_server_records_are_skipped_and_never_contacted(
        records: NfsNameResolve, healthy_server: str, caplog: pytest.LogCaptureFixture) -> None:
    """The trainer's and the generate client's discovery (wait_for_servers) sees only the trial's own servers; each
    planted record is named once in a warning with its reason, and its listener never gets a connection."""
    _register(records, 0, healthy_server)
    _register(records, 1, healthy_server)
    directory = Path(records.directory)
    with Listener() as evil, caplog.at_level(logging.WARNING, logger="rlkit.nameresolve"):
        planted = plant_server_records(directory, evil.address)
        for _ in range(3):  # readers poll: the warnings must not repeat
            servers = wait_for_servers(records, expected=2, timeout=10, poll=0.1, healthy=True)
            assert [(s.index, s.address) for s in servers] == [(0, healthy_server), (1, healthy_server)]
        assert evil.received == [], "a planted record's address was contacted"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for name, reason in planted.items():
        mine = [w for w in warnings if name in w]
        assert len(mine) == 1, (name, warnings)
        assert reason in mine[0], (name, mine[0])
    assert stat.S_IMODE(os.stat(records.path_of("servers/0")).st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_get_and_wait_skip_an_untrusted_record(records: NfsNameResolve) -> None:
    records.add("trainer/master/1.0", "node1:29500")
    os.chown(records.path_of("trainer/master/1.0"), OTHER_UID, OTHER_UID)
    with pytest.raises(NameEntryNotFoundError):
        records.get("trainer/master/1.0")
    with pytest.raises(NameResolveTimeoutError, match=f"owned by uid {OTHER_UID}"):
        records.wait("trainer/master/1.0", timeout=0.1, poll=0.05)
    assert records.list_subtree("") == {}


@pytest.mark.parametrize("problem", ["other owner", "group writable"])
def test_a_record_directory_another_user_could_write_is_ignored(
        records: NfsNameResolve, healthy_server: str, caplog: pytest.LogCaptureFixture, problem: str) -> None:
    """Another user who owns (or can write) the directory could rename or replace any record in it."""
    _register(records, 0, healthy_server)
    directory = Path(records.directory)
    if problem == "other owner":
        os.chown(directory, OTHER_UID, OTHER_UID)
    else:
        os.chmod(directory, 0o770)
    with caplog.at_level(logging.WARNING, logger="rlkit.nameresolve"):
        assert discover_servers(records) == []
        with pytest.raises(NameEntryNotFoundError):
            records.get(server_key(0))
    assert str(directory) in caplog.text
    writer = NfsNameResolve(directory)
    with pytest.raises(NameResolveError, match=r"cannot store name-resolve key 'x'.*only you can write"):
        writer.add("x", "y")


def test_a_planted_record_root_above_the_trial_is_refused(tmp_path: Path) -> None:
    """With nfs_record_root set, records live below <root>/<uid>/: if another user made that first, nothing is
    read from or written to it."""
    mine = tmp_path / "shared" / str(os.getuid())
    mine.mkdir(parents=True, mode=0o755)
    os.chown(mine, OTHER_UID, OTHER_UID)
    nr = NfsNameResolve(mine, "exp", "trial")
    with pytest.raises(NameResolveError, match=f"owned by uid {OTHER_UID}"):
        nr.add("servers/0", "{}")
    assert nr.list_subtree("") == {}


@pytest.mark.parametrize("address", ["node1:8000", "gpu-01.cluster.example:65535", "10.0.0.7:1", "[::1]:8000",
                                     "fe80::1:29500"])
def test_check_address_accepts_host_port(address: str) -> None:
    assert check_address(address) == address


@pytest.mark.parametrize("address", [
    "node1", "node1:", ":8000", "node1:0", "node1:65536", "node1:80a", "node1:+80", "node1: 80", "node 1:80",
    "user@evil:80", "evil/x:80", "http://evil:80", "evil:80/path", "evil:80?q", "evil:80#f", "evil\n:80",
    "[not-ip]:80", "[10.0.0.1]:80", "-evil:80", "a..b:80", "é.example:80", 8000, None,
])
def test_check_address_refuses_anything_else(address: object) -> None:
    with pytest.raises(ValueError):
        check_address(address)


def test_a_server_registered_at_a_bare_ipv6_address_is_reached(records: NfsNameResolve) -> None:
    """$RLKIT_ADVERTISE_HOST=fd00::5 registers `fd00::5:8000`, which check_address accepts (MASTER_ADDR's form);
    the URLs built from it must bracket the host, or every probe and request fails with httpx's InvalidURL (not an
    HTTPError: it escaped the pool's and the health probe's handling as a traceback)."""
    class _V6(ThreadingHTTPServer):
        address_family = socket.AF_INET6

    httpd = _V6(("::1", 0), _Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        address = f"::1:{httpd.server_address[1]}"
        _register(records, 0, address)
        assert [s.address for s in wait_for_servers(records, 1, timeout=10, healthy=True)] == [address]
        assert discover_servers(records)[0].url == f"http://[::1]:{httpd.server_address[1]}"
        assert http_url("[::1]:80") == "http://[::1]:80" and http_url("node1:80") == "http://node1:80"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_steps_never_import_a_planted_rlkit_from_the_trial_directory(tmp_path: Path) -> None:
    """The batch script runs in the trial directory; a step started there as before (`python -m rlkit` in that
    working directory) imports a planted rlkit/, from the working directory srun is now told to use it does not."""
    config = load_config(CONFIGS / "generate-cpu-demo.yaml",
                         [f"cluster.fileroot={tmp_path}", f"launcher.python={sys.executable}"])
    plan = plan_of(config)
    trial = Path(plan.trial_dir)
    trial.mkdir(parents=True, mode=0o700)
    marker = tmp_path / "marker"
    plant_rlkit_package(trial, marker)
    argv = step_command(plan.steps[-1], plan)
    python_part = list(argv[argv.index(sys.executable):])
    assert python_part[:3] == [sys.executable, "-m", "rlkit"]
    chdir = [a.removeprefix("--chdir=") for a in argv[:argv.index(sys.executable)] if a.startswith("--chdir=")]
    assert chdir == ["/"]
    probe = [*python_part[:4], "--help"]  # `python -m rlkit client --help`: the step's own command, runs nothing

    as_before = subprocess.run(probe, cwd=trial, capture_output=True, text=True, timeout=120)
    assert marker.exists() and as_before.returncode != 0, "the planted package must shadow rlkit from the trial dir"
    marker.unlink()

    now = subprocess.run(probe, cwd=chdir[0], capture_output=True, text=True, timeout=120)
    assert now.returncode == 0 and "--trial-dir" in now.stdout, now.stderr
    assert not marker.exists()


def test_waiting_for_healthy_servers_keeps_its_deadline_when_servers_hang(records: NfsNameResolve) -> None:
    """Servers that accept a connection and never answer /health were probed one after another, 5 s each, before the
    deadline was looked at: three of them held a 2 s wait for 15 s (and 32 servers a setup_timeout for minutes)."""
    import time

    from rlkit.errors import StepError

    silent = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]  # listening, never accepting, never answering
    try:
        for index, sock in enumerate(silent):
            _register(records, index, f"127.0.0.1:{sock.getsockname()[1]}")
        started = time.monotonic()
        with pytest.raises(StepError, match="waited 2 s for 3 inference servers"):
            wait_for_servers(records, expected=3, timeout=2, poll=0.1, healthy=True)
        assert time.monotonic() - started < 8, "the probes stretched the wait past its deadline"
    finally:
        for sock in silent:
            sock.close()
