"""Test helpers (not a conftest): hostile things another user could plant for a trial, and a listener that records
whoever falls for them (a planted server record points at it)."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path
from types import TracebackType

OTHER_UID = 65534  # nobody: "another user" (the tests run as root, so they can chown to it)


class Listener:
    """A TCP listener on 127.0.0.1 that accepts every connection and keeps what was sent on it (never answers)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    self.received.append(conn.recv(65536))
                except OSError:
                    self.received.append(b"")

    def __enter__(self) -> Listener:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def _record(key: str, entry: object) -> str:
    """An NFS name-resolve record in rlkit's own format (never expires: no keepalive)."""
    value = entry if isinstance(entry, str) else json.dumps(entry)
    return json.dumps({"format": 1, "key": key, "value": value, "keepalive": False, "heartbeat": None,
                       "owner": {"hostname": "elsewhere", "pid": 1, "token": "planted"}})


def _server(index: int, address: str) -> dict[str, object]:
    return {"index": index, "address": address, "backend": "vllm", "model": "/m", "weight_version": 0,
            "node": "evil"}


def plant_server_records(directory: Path, listener: str, first_index: int = 2) -> dict[str, str]:
    """Hostile `servers/<i>` records in a trial's record directory (each would send the client to `listener`),
    as {file name: why a reader must skip it}."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    port = listener.rpartition(":")[2]
    i = first_index
    planted: dict[str, str] = {}

    def write(reason: str, entry: object, *, mode: int = 0o600) -> Path:
        nonlocal i
        path = directory / f"servers:{i}.rec"
        path.write_text(_record(f"servers/{i}", entry))
        os.chmod(path, mode)
        planted[path.name] = reason
        i += 1
        return path

    os.chown(write("owned by uid", _server(i, listener)), OTHER_UID, OTHER_UID)
    write("lets group or others write", _server(i, listener), mode=0o666)
    path = directory / f"servers:{i}.rec"
    path.write_text("{not json")
    os.chmod(path, 0o600)
    planted[path.name] = "not a JSON record"
    i += 1
    write("neither a host name nor an IP address", _server(i, f"user@127.0.0.1:{port}"))  # http://user@host:port
    write("no port between 1 and 65535", _server(i, "127.0.0.1:0"))
    write("does not match its key", _server(0, listener))  # claims to be server 0
    elsewhere = directory.parent / f"elsewhere-{i}.rec"
    elsewhere.write_text(_record(f"servers/{i}", _server(i, listener)))
    os.chmod(elsewhere, 0o600)
    (directory / f"servers:{i}.rec").symlink_to(elsewhere)
    planted[f"servers:{i}.rec"] = "symbolic link"
    i += 1
    os.mkfifo(directory / f"servers:{i}.rec", 0o600)  # a reader that opened it for reading would hang
    planted[f"servers:{i}.rec"] = "not a regular file"
    return planted


def plant_rlkit_package(directory: Path, marker: Path) -> None:
    """An `rlkit/` package in `directory` that, if ever imported, writes `marker` and fails."""
    package = directory / "rlkit"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').write('the planted rlkit package was imported')\n"
        "raise SystemExit('planted rlkit imported')\n"
    )
