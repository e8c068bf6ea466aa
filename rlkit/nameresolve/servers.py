"""The inference-server records under ``servers/<index>``: what a reader accepts before it contacts an address.

A record's address is where the trainer sends the trial's bearer token and `rlkit status` sends its health probe,
so it must be a plain ``host:port`` (a host name or IP address, a port 1-65535): no scheme, path, user info or
whitespace that could turn the URL rlkit builds into another one. A record that is not valid JSON or lacks a field
is skipped with one warning naming it and why, never a crash (name resolve is shared state other steps write).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from rlkit import untrusted_json
from rlkit.nameresolve.base import NameResolve
from rlkit.nameresolve.records import warn_once

SERVERS_KEY = "servers"  # inference servers register as servers/<index>
# The servers of auxiliary model NAME register as auxiliary/<NAME>/<index>: outside servers/, so rollouts, weight
# updates, fingerprints and the policy's status rows never see them.
AUXILIARY_KEY = "auxiliary"

_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def server_key(index: int, auxiliary: str = "") -> str:
    """The name-resolve key of inference server `index` (of auxiliary model `auxiliary` when given)."""
    return f"{servers_prefix(auxiliary)}/{index}"


def servers_prefix(auxiliary: str = "") -> str:
    """Where the policy's servers register (of auxiliary model `auxiliary` when given)."""
    return auxiliary_prefix(auxiliary) if auxiliary else SERVERS_KEY


def auxiliary_prefix(name: str) -> str:
    """Where the servers of auxiliary model `name` register."""
    return f"{AUXILIARY_KEY}/{name}"


def server_step_name(index: int, auxiliary: str = "") -> str:
    """The job step (and log) name of server `index`: server-<i>, or aux-<name>-<i> for an auxiliary model's."""
    return f"aux-{auxiliary}-{index}" if auxiliary else f"server-{index}"


def check_address(address: object) -> str:
    """``address`` if it is ``host:port`` (host name, IPv4, [IPv6] or IPv6; port 1-65535), else ValueError saying
    why."""
    if not isinstance(address, str):
        raise ValueError(f"address {address!r} is not a string")
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"address {address!r} is not host:port")
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535):
        raise ValueError(f"address {address!r} has no port between 1 and 65535")
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        # [IPv6] (URLs), bare IPv6 (MASTER_ADDR) or IPv4
        ipaddress.IPv6Address(host[1:-1]) if bracketed else ipaddress.ip_address(host)
        return address
    except ValueError:
        if bracketed:
            raise ValueError(f"address {address!r} has an invalid IPv6 host") from None
    if len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in host.split(".")):
        raise ValueError(f"address {address!r} has a host that is neither a host name nor an IP address")
    return address


def http_url(address: str) -> str:
    """`http://host:port` of a checked address; a bare IPv6 host (`fd00::5:8000`, as $RLKIT_ADVERTISE_HOST may give
    it) is bracketed, which a URL needs (unbracketed, every request failed with httpx's InvalidURL)."""
    host, _, port = address.rpartition(":")
    return f"http://[{host}]:{port}" if ":" in host and not host.startswith("[") else f"http://{address}"


@dataclass(frozen=True)
class ServerRecord:
    """One registered inference server, as read from name resolve and checked."""

    index: int
    address: str
    model: str
    backend: str
    node: str
    weight_version: Any


def parse_server_record(value: str) -> ServerRecord:
    """The server record in ``value``; ValueError saying what is wrong with it."""
    try:
        entry = untrusted_json.loads(value)
    except ValueError:
        raise ValueError("it is not JSON") from None
    if not isinstance(entry, dict):
        raise ValueError("it is not a JSON object")
    index = entry.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"its index {index!r} is not a non-negative integer")
    for field in ("model", "backend"):
        if not isinstance(entry.get(field), str):
            raise ValueError(f"its {field} is not a string")
    node = entry.get("node", "")
    return ServerRecord(index=index, address=check_address(entry.get("address")), model=entry["model"],
                        backend=entry["backend"], node=node if isinstance(node, str) else "",
                        weight_version=entry.get("weight_version"))


def read_servers(nr: NameResolve, auxiliary: str = "") -> list[ServerRecord]:
    """The live, well-formed server records of the policy (of auxiliary model `auxiliary` when given), by index;
    each malformed one is skipped with a warning (once)."""
    servers = []
    for key, value in nr.list_subtree(servers_prefix(auxiliary)).items():
        try:
            record = parse_server_record(value)
            if key != server_key(record.index, auxiliary):
                raise ValueError(f"its index {record.index} does not match its key")
        except ValueError as e:
            warn_once(f"server {nr.describe_entry(key)}", str(e))
            continue
        servers.append(record)
    return sorted(servers, key=lambda s: s.index)
